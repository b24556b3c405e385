"""`t4patch verify llama.cpp`: llama.cpp's own correctness suite (test-backend-ops) on the ops Gemma 4 E2B uses."""
