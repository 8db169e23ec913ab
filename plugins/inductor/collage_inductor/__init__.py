"""TorchInductor as a Collage backend: partitions become PyTorch programs compiled by torch.compile.

Importing the package registers the packed function ``collage_inductor.run`` that lowered
partitions call, so a built library needs only ``import collage_inductor`` before it runs.
"""

from collage_inductor import runtime

runtime.register()

__all__ = ["runtime"]
