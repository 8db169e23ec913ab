"""``collage_core.relax_onnx.operator_cases`` for plugin tests: one small function per operator the graph-level
engines share (``CASES``, ``REFUSED``), TVM's build as the reference (``run_tvm``, ``assert_same``)."""

from collage_core.relax_onnx.operator_cases import *  # noqa: F401,F403
