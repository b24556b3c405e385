"""CUDA knowledge: GPU architectures, the driver/NVML probe, fatbin and cubin reading, cuobjdump."""
