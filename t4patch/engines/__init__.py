"""Engine-specific knowledge, one subpackage per engine (``vllm``, ``sglang``) behind one interface."""
