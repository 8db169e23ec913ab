"""Relax partitions as ONNX models, shared by every graph-level backend that takes ONNX.

- :mod:`~collage_core.relax_onnx.support`: which operator calls convert exactly, and why the
  others are refused;
- :mod:`~collage_core.relax_onnx.converter`: a partition (one dataflow block) as an ONNX model,
  opset 17;
- :mod:`~collage_core.relax_onnx.patterns`: one checked pattern per convertible operator, named
  after the backend that contributes it;
- :mod:`~collage_core.relax_onnx.lowering`: a partition replaced by one ``R.call_dps_packed`` to
  the backend's run function, its model carried as a digest-checked constant;
- :mod:`~collage_core.relax_onnx.operator_cases`: one small function per convertible operator
  (and per refusal), with TVM's own build as the reference, for each backend's numerics tests.
"""

from collage_core.relax_onnx.converter import OPSET, UnsupportedError, convert, input_name, output_name
from collage_core.relax_onnx.support import SUPPORTED_OPS, refusal, supports

__all__ = ["OPSET", "SUPPORTED_OPS", "UnsupportedError", "convert", "input_name", "output_name", "refusal", "supports"]
