"""Hand-run GPU research harnesses for the engines' attention kernels, used by the GPU tests and recorded runs.

Each drives one engine's own Triton kernels (so they name engines freely); no command uses them, and they are
not part of the t4patch package: run them from the repository root as ``python -m tools.research.<name>``.
"""
