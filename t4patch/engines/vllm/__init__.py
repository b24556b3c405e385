"""vLLM: its Triton attention driver for `verify attention` and its compiled Marlin library loader."""
