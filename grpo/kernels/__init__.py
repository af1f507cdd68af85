"""Optional Triton kernels, each tested against a PyTorch reference (see each module's docstring)."""
