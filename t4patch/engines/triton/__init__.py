"""Triton, the compiler every engine's attention kernels go through: its t4patch set puts fp16 ``tl.dot`` on a
T4's tensor cores (patches/triton/<version>/; what it changes and why: docs/engines/triton.md)."""
