"""TVM's kernels tuned by MetaSchedule as a Collage backend, ``tvm-tuned``: see README.md."""
