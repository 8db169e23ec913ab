"""A CUTLASS partition function becomes one call of its tuned kernel, ``collage_cutlass.<kernel>``, on its spec and operands."""

from __future__ import annotations

from tvm import relax

from collage_core.build import packed_call_function
from collage_core.fused_groups import Group, Refused
from collage_core.partition import pattern_of
from collage_core.precision import computes_tf32
from collage_cutlass import library, specs, tuning


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
    return packed_call_function(func, name, f"collage_cutlass.{kernel.name}", specs.as_text(spec.array()), spec.operands)
