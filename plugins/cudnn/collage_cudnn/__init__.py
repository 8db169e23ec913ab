"""cuDNN (its graph API, through the cudnn-frontend) as a Collage op-level backend on NVIDIA GPUs."""
