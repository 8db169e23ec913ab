"""A CUTLASS partition function becomes one call of its tuned kernel, ``collage_cutlass.<kernel>``, on its spec and operands.

A convolution written NCHW is called between its layout changes (conv_specs.py): the input and a
residual transposed to NHWC, the kernel's NHWC output transposed back, all inside the partition.
"""

from __future__ import annotations

from tvm import relax

from collage_core.kit import Group, Refused, computes_tf32, packed_call_function, pattern_of, tvm_compat
from collage_cutlass import conv_specs, library, specs, tuning


def lower_function(func: relax.Function, name: str) -> relax.Function:
    """``func`` with its body replaced by the call of the fastest CUTLASS kernel for it on this GPU."""
    try:
        spec = specs.recognize(Group.from_function(func), tf32=computes_tf32(pattern_of(func)))
    except Refused as refused:
        raise ValueError(f"CUTLASS partition {name}: {refused}") from None
    library.cutlass_includes()
    library.find_nvcc()
    kernel = tuning.best_kernel(spec)
    library.load(kernel)
    library.record_chosen(kernel)
    packed, text = f"collage_cutlass.{kernel.name}", specs.as_text(spec.array())
    if not (isinstance(spec, conv_specs.ConvSpec) and spec.output_channel_first):
        return packed_call_function(func, name, packed, text, spec.operands)
    # An NCHW convolution: the kernel's call on NHWC operands, between the transposes from and back to NCHW.
    (n, c, h, w), out_dtype = tvm_compat.type_shape_dtype(tvm_compat.return_type(func))
    return packed_call_function(
        func, name, packed, text, spec.operands,
        before={index: _channel_last for index in spec.channel_first}, out_type=relax.TensorType((n, h, w, c), out_dtype),
        after=lambda channel_last: relax.op.permute_dims(channel_last, conv_specs.TO_CHANNELS_FIRST),
    )


def _channel_last(expr):
    return relax.op.permute_dims(expr, conv_specs.TO_CHANNELS_LAST)
