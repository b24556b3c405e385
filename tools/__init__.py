"""Maintainer tools that run from a checkout, beside the package rather than inside it.

``tools.research`` (GPU research harnesses) and ``tools.bench`` (benchmarks) import t4patch but no t4patch
module imports them, and no command uses them; keeping them outside ``t4patch/`` means the package is the same
whether it is imported from a checkout or from an installed wheel (the wheel ships exactly ``t4patch/``). Run
them from the repository root: ``python -m tools.bench.status``, ``python -m tools.research.attention_gpu ...``.
"""
