"""Collage backend plugin: oneDNN kernels for convolutions, matrix products, pooling, softmax and layer norm."""
