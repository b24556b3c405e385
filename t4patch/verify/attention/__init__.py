"""`verify attention`: each engine's Triton attention compiled for a GPU architecture, checked against its limits."""
