"""Kernel verification: checks that run engines' kernels (or compile them for sm_75) against references."""
