"""A DNNL partition function becomes one ``collage_dnnl.run`` call on its kernel spec and operands."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_dnnl import library, specs

RUN_FUNCTION = "collage_dnnl.run"
PACK_FUNCTION = "collage_dnnl.pack_weights"


def _with_packed_weights(spec: specs.KernelSpec) -> specs.KernelSpec:
    """The spec completed with the layout oneDNN prefers here, and the weights reordered into it."""
    weights = spec.operands[spec.packed_operand]
    cpu = tvm.cpu(0)
    blob = tvm.get_global_func(PACK_FUNCTION)(
        tvm_compat.to_tensor(spec.array(), cpu), tvm_compat.to_tensor(tvm_compat.constant_array(weights), cpu)
    )
    descriptor_bytes = int(tvm.get_global_func("collage_dnnl.descriptor_words")()) * 8
    data = bytes(blob)
    descriptor = np.frombuffer(data[:descriptor_bytes], dtype=np.int64)
    packed = np.frombuffer(data[descriptor_bytes:], dtype=np.float32).copy()
    words = (*spec.words[:-1], 1, *descriptor.tolist())
    operands = list(spec.operands)
    operands[spec.packed_operand] = relax.const(packed, "float32")
    return specs.KernelSpec(words, tuple(operands))


def lower_function(func: relax.Function, name: str) -> relax.Function:
    """``func`` with its body replaced by the kernel call (weights packed for this CPU)."""
    library.load()
    try:
        spec = specs.recognize(specs.Group.from_function(func))
    except specs.Refused as refused:
        raise ValueError(f"DNNL partition {name}: {refused}") from None
    if spec.packed_operand is not None:
        spec = _with_packed_weights(spec)
    params = [relax.Var(param.name, tvm_compat.value_type(param)) for param in func.params]
    mapping = dict(zip(func.params, params))
    operands = [mapping.get(operand, operand) for operand in spec.operands]
    out_type = tvm_compat.return_type(func)
    bb = relax.BlockBuilder()
    with bb.function(name, params, attrs=dict(func.attrs) if func.attrs is not None else None, private=True):
        with bb.dataflow():
            call = relax.call_dps_packed(RUN_FUNCTION, [relax.const(spec.array(), "int64"), *operands], out_type)
            output = bb.emit_output(call)
        bb.emit_func_output(output)
    return bb.get()[name]
