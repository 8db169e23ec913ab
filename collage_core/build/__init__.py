"""Building: a placement applied to the model, each backend's partitions lowered and the whole built into one TVM
executable, the native kernels and CUDA libraries backends bring, and exported libraries that say what they need."""
