"""The layout a model's convolutions are placed in: as the model writes them, or channel-last.

ONNX models write 2-d convolutions NCHW with OIHW weights. Tensor-core convolutions (cuDNN's fused
engines, CUTLASS's implicit GEMM) read NHWC with OHWI weights, so at 16 bits an NCHW model pays a
layout change around each convolution. With ``layout="nhwc"`` (``collage optimize --layout nhwc``)
TVM's ``ConvertLayout`` rewrites every 2-d convolution to NHWC/OHWI once, before anything is
placed: the operators between convolutions (bias, residual adds, activations, pooling) follow the
layout, the constant weights are transposed at import, and the layout changes that remain (at the
model's inputs and outputs, and around operators that cannot follow) are operators the search places
and measures like any other. The model's outputs are unchanged, so the reference checks them as before.
"""

from __future__ import annotations

import attrs
import tvm
from tvm import relax

from collage_core.errors import CollageError
from collage_core.model.dtypes import FP32

MODEL, NHWC = "model", "nhwc"
LAYOUTS = (MODEL, NHWC)
# What ConvertLayout is asked for: each 2-d convolution's data and weight layouts.
DESIRED = {"relax.nn.conv2d": ["NHWC", "OHWI"]}


def require_known(layout: str) -> None:
    if layout not in LAYOUTS:
        raise CollageError(f"unknown layout {layout!r} (Collage knows {', '.join(LAYOUTS)})")


def convolutions(mod) -> int:
    """How many 2-d convolutions ``mod["main"]`` holds."""
    return _count_ops(mod, "relax.nn.conv2d")


def channel_last(mod):
    """``mod`` with every 2-d convolution in NHWC/OHWI, its constant weights transposed once."""
    passes = [
        relax.transform.ConvertLayout(DESIRED),
        relax.transform.FoldConstant(),
        relax.transform.CanonicalizeBindings(),
        relax.transform.DeadCodeElimination(["main"]),
    ]
    return tvm.transform.Sequential(passes)(mod)


def with_layout(imported, layout: str):
    """``imported`` (an ImportedModel at float32, as ``load_model`` gives it) with its convolutions in ``layout``:
    its module, layout and fingerprint; unchanged for ``"model"`` or a model without 2-d convolutions."""
    require_known(layout)
    if layout == imported.layout:
        return imported
    if imported.layout != MODEL or imported.precision != FP32:
        raise CollageError(f"{imported.name}: the layout is changed once, at float32, from the model's own")
    if not convolutions(imported.mod):
        return imported
    return attrs.evolve(imported, mod=channel_last(imported.mod), layout=layout, fingerprint=f"{imported.fingerprint}+{layout}")


def describe(imported) -> str:
    """One line for the run's progress on what the layout did to the model."""
    remaining = _count_ops(imported.mod, "relax.permute_dims")
    return (
        f"layout {imported.layout}: {convolutions(imported.mod)} convolutions channel-last (NHWC, OHWI weights), "
        f"{remaining} layout changes left for the search to place"
    )


def _count_ops(mod, name: str) -> int:
    """How many calls of the operator ``name`` ``mod["main"]`` holds."""
    count = 0

    def visit(expr):
        nonlocal count
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == name:
            count += 1

    relax.analysis.post_order_visit(mod["main"], visit)
    return count
