"""ONNX Runtime as a Collage backend: partitions become ONNX models run in place through IOBinding.

Importing the package registers the packed function ``collage_onnxruntime.run`` that lowered
partitions call, so a built library needs only ``import collage_onnxruntime`` before it runs.
"""

from collage_onnxruntime import runtime

runtime.register()

__all__ = ["runtime"]
