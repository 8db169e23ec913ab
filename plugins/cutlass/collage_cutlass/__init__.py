"""CUTLASS 3 kernels for Hopper GPUs as a Collage op-level backend."""
