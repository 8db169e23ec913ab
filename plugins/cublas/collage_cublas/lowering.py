"""A cuBLAS partition function becomes one ``collage_cublas.run`` call on its spec and operands.

The build times cuBLASLt's candidate algorithms for each problem on the GPU (for an output whose rows are
not 16 bytes apart, written in place and through a padded buffer copied into place two ways) and keeps the fastest
in the spec; the choice is stored by spec, GPU and cuBLAS version
(``$COLLAGE_CACHE_DIR/cublas/algorithms.json``), so later builds on this machine make the same
kernel without timing again. Built where there is no GPU, the runtime takes cuBLASLt's first
heuristic choice instead.
"""

from __future__ import annotations

import tvm
from tvm import relax

from collage_core.kit import (
    ChoiceStore, Group, Refused, computes_bf16x6, computes_tf32, cuda_libraries, packed_call_function, pattern_of,
)
from collage_cublas import library, specs

RUN_FUNCTION = "collage_cublas.run"
TUNE_FUNCTION = "collage_cublas.tune"


def _algorithm(spec: specs.KernelSpec) -> tuple[int, ...]:
    """The fastest algorithm's words for ``spec`` on this GPU (timed once, then remembered), or () without a GPU."""
    words = int(tvm.get_global_func("collage_cublas.algo_words")())
    store = ChoiceStore(library.cache_dir() / "algorithms.json", lambda value: isinstance(value, list) and len(value) == words)
    tune = tvm.get_global_func(TUNE_FUNCTION)
    return cuda_libraries.tuned_on_gpu(store, spec.words, library.cublas_version(), lambda: tune(specs.as_text(spec.array())))


def lower_function(func: relax.Function, name: str) -> relax.Function:
    """``func`` with its body replaced by the cuBLASLt call (the fastest algorithm chosen on this GPU)."""
    library.load()
    try:
        pattern = pattern_of(func)
        spec = specs.recognize(Group.from_function(func), tf32=computes_tf32(pattern), aligned=True, bf16x6=computes_bf16x6(pattern))
    except Refused as refused:
        raise ValueError(f"cuBLAS partition {name}: {refused}") from None
    text = specs.as_text(spec.array(_algorithm(spec)))
    return packed_call_function(func, name, RUN_FUNCTION, text, spec.operands, before=spec.before)
