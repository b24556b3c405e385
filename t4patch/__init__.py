"""t4patch: run today's LLM serving engines on NVIDIA Turing GPUs (Tesla T4, sm_75).

Versioned, hash-pinned diff sets for installed engines, sm_75 builds of llama.cpp and mistral.rs, and
kernel verification. Importing this package is cheap on purpose: torch, triton and the engines are
imported only inside the commands that need them.
"""

__version__ = "0.1.0"
