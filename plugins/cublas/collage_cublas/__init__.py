"""cuBLAS (cuBLASLt) as a Collage op-level backend on NVIDIA GPUs."""
