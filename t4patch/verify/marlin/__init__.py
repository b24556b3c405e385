"""`t4patch verify marlin`: Marlin W4A16 GEMM and repack of an installed engine, checked on a real GPU.

The engine's kernels (vLLM's compiled Marlin, or SGLang's patched functions that redirect to it) run on
model-shaped problems and are compared with references t4patch computes itself: the Marlin tile layout in
Python (repack must match exactly), an fp16 matmul of the dequantized weights (accuracy), repeated runs
(determinism), large activations (overflow) and a memory roofline (speed). Everything needing torch or a GPU
is imported inside functions, so importing this package stays cheap.
"""
