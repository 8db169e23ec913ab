"""What a CUTLASS convolution group computes, as one channel-last convolution problem, and the layout change it needs.

The kernels (conv_kernels.py) read NHWC activations and KRSC (``OHWI``) filters and write NHWC. A
Relax convolution written channel-last runs as it is. One written NCHW (as ONNX models are) runs in
the same kernel between two transposes the lowering adds: the input (and a residual) to NHWC before
the call, the output back to NCHW after it, each a TVM kernel inside the partition, so a candidate's
measured cost is the kernel's and its layout change's together, and the search weighs both against
cuDNN's and TVM's convolutions. The filter is a constant: it is transposed to KRSC here, once.

Hopper's TMA needs the channel counts (every stride but the unit one) to be multiples of 16 bytes,
and its im2col loads bound the convolution: strides of at most 8 (the driver's limit, which CUTLASS
does not check), padding of at most 256 and a dilated filter span under 255 (which CUTLASS's
``can_implement`` checks too; refused here with the reason). Groups, and a filter that is not a
constant, are refused. The epilogue is the GEMM kernels': a bias
per output channel, a residual, one activation, in float32, rounding once to the output's type.
``runtime/conv_runner.h`` reads the words; keep the two in step.
"""

from __future__ import annotations

import attrs
import numpy as np
from tvm import relax

from collage_core.kit import (
    FLOAT32, Group, Refused, as_dtype, expect_plain_out_dtype, external, ints, padding4, read_epilogue, shape_of,
    tvm_compat, uniform_operand_dtype,
)
from collage_cutlass.conv_kernels import ConvKind
from collage_cutlass.kernels import BYTES, OPERAND_ALIGNMENT_BYTES, OPERAND_DTYPES, expect_kernel_operands

CONV_SPEC_VERSION = 1
FUSED = ("cast", "bias", "residual", "relu", "gelu_erf", "gelu_tanh", "silu")
LAYOUTS = {("NCHW", "OIHW"): True, ("NHWC", "OHWI"): False}  # whether the data is channel-first
MAX_STRIDE, MAX_PADDING, MAX_FILTER_SPAN = 8, 256, 254  # TMA im2col: element strides, padding, (R - 1) x dilation
TO_CHANNELS_LAST, TO_CHANNELS_FIRST = (0, 2, 3, 1), (0, 3, 1, 2)


@attrs.frozen
class ConvSpec:
    """The kind of kernel, the spec words (version first), the operands in kernel order, and which of them
    (with the output) the lowering transposes from NCHW to NHWC (and back)."""

    kind: ConvKind
    words: tuple[int, ...]
    operands: tuple = attrs.field(eq=False)
    channel_first: tuple[int, ...] = ()
    output_channel_first: bool = False

    def array(self) -> np.ndarray:
        return np.array(self.words, dtype=np.int64)

    def problem(self) -> list[int]:
        """``[N, H, W, C, K, R, S]``: the sizes tuning records."""
        return [int(word) for word in self.words[6:13]]

    def describe_problem(self) -> str:
        n, h, w, c, k, r, s = self.problem()
        top, left, bottom, right, stride_h, stride_w, dilation_h, dilation_w = self.words[15:23]
        return (f"{self.kind.describe()} convolution (N={n}, H={h}, W={w}, C={c}, K={k}, {r}x{s} filter, "
                f"padding {top},{left},{bottom},{right}, stride {stride_h}x{stride_w}, dilation {dilation_h}x{dilation_w})")


def _aligned_channels(what: str, channels: int, dtype: str) -> None:
    elements = OPERAND_ALIGNMENT_BYTES // BYTES[dtype]
    if channels % elements:
        raise Refused(f"{channels} {what} channels; Hopper's TMA needs a multiple of {elements} ({dtype})")


def _within_im2col_limits(r: int, s: int, padding, strides, dilation) -> None:
    if any(not 1 <= stride <= MAX_STRIDE for stride in strides):
        raise Refused(f"conv2d strides {list(strides)}: Hopper's TMA im2col loads take strides of 1 to {MAX_STRIDE}")
    if any(pad > MAX_PADDING for pad in padding):
        raise Refused(f"conv2d padding {list(padding)}: Hopper's TMA im2col loads take at most {MAX_PADDING}")
    if (r - 1) * dilation[0] > MAX_FILTER_SPAN or (s - 1) * dilation[1] > MAX_FILTER_SPAN:
        raise Refused(f"a {r}x{s} filter dilated {list(dilation)}: Hopper's TMA im2col offsets reach at most {MAX_FILTER_SPAN}")


def recognize_conv(group: Group, conv, tf32: bool = False) -> ConvSpec:
    """The CUTLASS convolution computing ``group`` from its ``conv`` anchor, or :class:`Refused` saying why there is none."""
    attributes = conv.attrs
    layouts = (str(attributes.data_layout), str(attributes.kernel_layout))
    if layouts not in LAYOUTS or str(attributes.out_layout) != layouts[0]:
        raise Refused(f"conv2d layouts {layouts[0]}/{layouts[1]} -> {attributes.out_layout} (NCHW/OIHW or NHWC/OHWI)")
    channel_first = LAYOUTS[layouts]
    expect_plain_out_dtype(conv)
    if group.calls[0] is not conv:
        raise Refused("the group holds operators before the convolution")
    if int(attributes.groups) != 1:
        raise Refused(f"conv2d with {int(attributes.groups)} groups")
    data, weights = conv.args
    allowed = (*OPERAND_DTYPES, FLOAT32)
    external(group, data, allowed)
    operand_dtype = uniform_operand_dtype(conv, (data, weights), allowed)
    expect_kernel_operands(operand_dtype, tf32)
    filters = tvm_compat.constant_array(weights)
    if filters is None:
        raise Refused("conv2d weights that are not constants")
    if channel_first:
        (n, c, h, w), (k, _, r, s), (_, _, p, q) = shape_of(data), filters.shape, shape_of(conv)
        filters = filters.transpose(0, 2, 3, 1)  # OIHW -> OHWI (KRSC)
    else:
        (n, h, w, c), (k, r, s, _), (_, p, q, _) = shape_of(data), filters.shape, shape_of(conv)
    epilogue = read_epilogue(group, conv, k, 3 if channel_first else 1, FUSED)
    _aligned_channels("input", c, operand_dtype)
    _aligned_channels("output", k, epilogue.out_dtype)
    kind = ConvKind(operand_dtype, epilogue.out_dtype, epilogue.bias is not None, epilogue.residual is not None,
                    epilogue.activation)
    operands = [data, relax.const(np.ascontiguousarray(filters), operand_dtype)]
    if epilogue.bias is not None:
        operands.append(relax.const(as_dtype(epilogue.bias, epilogue.out_dtype), epilogue.out_dtype))
    if epilogue.residual is not None:
        operands.append(epilogue.residual)
    top, left, bottom, right = padding4(attributes.padding)
    strides, dilation = ints(attributes.strides), ints(attributes.dilation)
    _within_im2col_limits(r, s, (top, left, bottom, right), strides, dilation)
    words = (CONV_SPEC_VERSION, *kind.words(), n, h, w, c, k, r, s, p, q, top, left, bottom, right, *strides, *dilation)
    moved = (0, len(operands) - 1) if epilogue.residual is not None else (0,)
    return ConvSpec(kind, words, tuple(operands), moved if channel_first else (), channel_first)
