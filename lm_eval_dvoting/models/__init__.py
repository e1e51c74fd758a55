"""Native PyTorch architectures of the supported diffusion LMs, and their loader."""
