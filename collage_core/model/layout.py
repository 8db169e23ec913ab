"""The layout a model's convolutions are placed in: as the model writes them, or channel-last.

ONNX models write 2-d convolutions NCHW with OIHW weights. Tensor-core convolutions (cuDNN's fused
engines, CUTLASS's implicit GEMM) read NHWC with OHWI weights, so at 16 bits an NCHW model pays a
layout change around each convolution. With ``layout="nhwc"`` (``collage optimize --layout nhwc``)
TVM's ``ConvertLayout`` rewrites every 2-d convolution to NHWC/OHWI once, before anything is
placed: the operators between convolutions (bias, residual adds, activations, pooling) follow the
layout, the constant weights are transposed at import, and the layout changes that remain (at the
model's inputs and outputs, and around operators that cannot follow) are operators the search places
and measures like any other. The model's outputs are unchanged, so the reference checks them as before.

The default, ``layout="auto"``, takes NHWC where it pays: a model with 2-d convolutions placed at bf16 or fp16
on CUDA (on an H100, cuDNN ran ResNet-50's 53 convolutions 1.33x to 1.42x faster in NHWC at 16 bits, and 0.75x
to 0.80x as fast at float32: ``benchmarks/conv_layout.py``); the model's own layout anywhere else.
"""

from __future__ import annotations

import attrs
import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_core.errors import CollageError
from collage_core.model.dtypes import BF16, FP16, FP32

MODEL, NHWC, AUTO = "model", "nhwc", "auto"
# The layouts a model is placed in (and a placement file records); AUTO chooses one of them (resolve).
LAYOUTS = (MODEL, NHWC)
ASKABLE = (AUTO, *LAYOUTS)
# Where AUTO takes NHWC: tensor-core convolutions at these precisions on CUDA.
CHANNEL_LAST_PRECISIONS = (BF16, FP16)
# What ConvertLayout is asked for: each 2-d convolution's data and weight layouts.
DESIRED = {"relax.nn.conv2d": ["NHWC", "OHWI"]}


def require_known(layout: str) -> None:
    if layout not in LAYOUTS:
        raise CollageError(f"unknown layout {layout!r} (Collage knows {', '.join(LAYOUTS)})")


def resolve(asked, target, precision: str, mod) -> str:
    """The layout to place ``mod`` in when ``asked`` (None or "auto": NHWC for a model with 2-d convolutions at a
    16-bit precision on CUDA, else the model's own; "model" or "nhwc" as asked)."""
    if asked not in (None, AUTO):
        require_known(asked)
        return asked
    channel_last = tvm_compat.is_cuda(target) and precision in CHANNEL_LAST_PRECISIONS and convolutions(mod) > 0
    return NHWC if channel_last else MODEL


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
