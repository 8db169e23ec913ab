"""OpenVINO as a Collage backend: partitions become OpenVINO models run in place on the CPU.

Importing the package registers the packed function ``collage_openvino.run`` that lowered
partitions call, so a built library needs only ``import collage_openvino`` before it runs.
"""

from collage_openvino import runtime

runtime.register()

__all__ = ["runtime"]
