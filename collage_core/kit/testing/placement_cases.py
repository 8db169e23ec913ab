"""``collage_core.relax_onnx.placement_cases`` for plugin tests: mixed placements of a graph-level engine
beside TVM (``place``, ``run_vm``, conv-bias-ReLU and attention with numpy references)."""

from collage_core.relax_onnx.placement_cases import *  # noqa: F401,F403
