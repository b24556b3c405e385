"""Hand-run GPU research harnesses for the engines' attention kernels, used by the GPU tests and recorded runs.

They are engine code by nature (each drives one engine's own Triton kernels), so they live under engines/; no
command uses them and the wheel leaves them out (pyproject's exclude).
"""
