"""A CUTLASS partition function becomes one call of its tuned kernel, ``collage_cutlass.<kernel>``, on its spec and operands.

A convolution written NCHW is called between its layout changes (conv_specs.py): the input and a
residual transposed to NHWC, the kernel's NHWC output transposed back, all inside the partition.
"""

from __future__ import annotations

from tvm import relax

from collage_core import tvm_compat
from collage_core.build import packed_call_function
from collage_core.fused_groups import Group, Refused
from collage_core.partition import pattern_of
from collage_core.precision import computes_tf32
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
    if isinstance(spec, conv_specs.ConvSpec) and spec.output_channel_first:
        return _channel_last_call(func, name, packed, text, spec)
    return packed_call_function(func, name, packed, text, spec.operands)


def _channel_last_call(func: relax.Function, name: str, packed: str, text: str, spec: conv_specs.ConvSpec) -> relax.Function:
    """The kernel's call on NHWC operands, between the transposes from and back to the partition's NCHW."""
    params = [relax.Var(param.name, tvm_compat.value_type(param)) for param in func.params]
    mapping = dict(zip(func.params, params))
    (n, c, h, w), out_dtype = tvm_compat.type_shape_dtype(tvm_compat.return_type(func))
    bb = relax.BlockBuilder()
    with bb.function(name, params, attrs=dict(func.attrs) if func.attrs is not None else None, private=True):
        with bb.dataflow():
            arguments = [tvm_compat.string_expr(text)]
            for index, operand in enumerate(spec.operands):
                operand = mapping.get(operand, operand)
                if index in spec.channel_first:
                    operand = bb.emit(relax.op.permute_dims(operand, conv_specs.TO_CHANNELS_LAST))
                arguments.append(operand)
            channel_last = bb.emit(relax.call_dps_packed(packed, arguments, relax.TensorType((n, h, w, c), out_dtype)))
            output = bb.emit_output(relax.op.permute_dims(channel_last, conv_specs.TO_CHANNELS_FIRST))
        bb.emit_func_output(output)
    return bb.get()[name]
