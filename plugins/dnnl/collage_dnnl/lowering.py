"""A DNNL partition function becomes one ``collage_dnnl.run`` call on its kernel spec and operands."""

from __future__ import annotations

import hashlib
import time

import attrs
import numpy as np
import tvm
from tvm import relax

from collage_core.kit import ChoiceStore, packed_call_function, tvm_compat
from collage_dnnl import library, specs

RUN_FUNCTION = "collage_dnnl.run"
PACK_FUNCTION = "collage_dnnl.pack_weights"
LAYOUT_TRIALS = 8  # runs per convolution layout at build time; the first creates the primitive
LAYOUTS = (specs.PLAIN_ACTIVATIONS, specs.BLOCKED_ACTIVATIONS)


def _with_packed_weights(spec: specs.KernelSpec) -> specs.KernelSpec:
    """The spec completed with the layout oneDNN prefers here, and the weights reordered into it.

    The spec's last word is 0 (no stored layout); it becomes 1 followed by the descriptor.
    """
    weights = spec.operands[spec.packed_operand]
    cpu = tvm.cpu(0)
    blob = bytes(
        tvm.get_global_func(PACK_FUNCTION)(
            tvm_compat.to_tensor(spec.array(), cpu), tvm_compat.to_tensor(tvm_compat.constant_array(weights), cpu)
        )
    )
    descriptor_bytes = int(tvm.get_global_func("collage_dnnl.descriptor_words")()) * 8
    descriptor = np.frombuffer(blob[:descriptor_bytes], dtype=np.int64)
    dtype = tvm_compat.tensor_shape_dtype(weights)[1]
    packed = np.frombuffer(blob[descriptor_bytes:], dtype=dtype).copy()
    operands = list(spec.operands)
    operands[spec.packed_operand] = relax.const(packed, dtype)
    return specs.KernelSpec((*spec.words[:-1], 1, *descriptor.tolist()), tuple(operands))


def _seconds_per_run(spec: specs.KernelSpec, output_shape) -> float:
    """The fastest of a few runs of the kernel on random data (constants as they are)."""
    cpu, rng = tvm.cpu(0), np.random.default_rng(0)
    tensors = [tvm_compat.to_tensor(spec.array(), cpu)]
    for operand in spec.operands:
        value = tvm_compat.constant_array(operand)
        if value is None:
            shape, dtype = tvm_compat.tensor_shape_dtype(operand)
            value = rng.uniform(-1, 1, size=shape).astype(dtype)
        tensors.append(tvm_compat.to_tensor(value, cpu))
    tensors.append(tvm_compat.to_tensor(np.zeros(output_shape, np.float32), cpu))
    run = tvm.get_global_func(RUN_FUNCTION)
    best = float("inf")
    for _ in range(LAYOUT_TRIALS):
        started = time.perf_counter()
        run(*tensors)
        best = min(best, time.perf_counter() - started)
    return best


def _with_layout(spec: specs.KernelSpec, layout: int) -> specs.KernelSpec:
    layout_word = len(spec.words) - 2
    return _with_packed_weights(attrs.evolve(spec, words=(*spec.words[:layout_word], layout, 0)))


def _with_fastest_layout(spec: specs.KernelSpec, output_shape) -> specs.KernelSpec:
    """A convolution in whichever activation layout runs faster on this CPU, weights packed for it.

    The first build of a convolution times both layouts; the choice is kept in the kernel
    cache (by the spec's words, which hold shapes and attributes, not weights), so every later
    build of it on this machine, a replay or an export, makes the same kernel.
    """
    choices = ChoiceStore(library.cache_dir() / "layout_choices.json", lambda layout: layout in LAYOUTS)
    key = hashlib.sha256(np.array(spec.words, dtype=np.int64).tobytes()).hexdigest()
    layout = choices.get(key)
    if layout is not None:
        return _with_layout(spec, layout)
    variants = {layout: _with_layout(spec, layout) for layout in LAYOUTS}
    layout = min(variants, key=lambda layout: _seconds_per_run(variants[layout], output_shape))
    choices.put(key, layout)
    return variants[layout]


def lower_function(func: relax.Function, name: str) -> relax.Function:
    """``func`` with its body replaced by the kernel call (weights packed for this CPU)."""
    library.load()
    try:
        spec = specs.recognize(specs.Group.from_function(func))
    except specs.Refused as refused:
        raise ValueError(f"DNNL partition {name}: {refused}") from None
    if spec.packed_operand is not None:
        spec = _with_fastest_layout(spec, tvm_compat.tensor_shape_dtype(func.body.body)[0])
    return packed_call_function(func, name, RUN_FUNCTION, spec.array(), spec.operands)
