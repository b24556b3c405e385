"""Benchmarks: scripts that print ratios measured side by side in one run (never timed tests).

Run from the repository root as ``python -m tools.bench.<name>``; not part of the t4patch package.
"""
