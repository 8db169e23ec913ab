"""A cuDNN partition function becomes one ``collage_cudnn.run`` call on its spec and operands.

The build builds the first execution plans cuDNN's heuristics rank for the partition's graph
(six at most), times them on the GPU and keeps the fastest plan's engine and knobs in the spec; the choice is
stored by graph (shapes included), GPU and cuDNN version (``$COLLAGE_CACHE_DIR/cudnn/plans.json``),
so later builds on this machine make the same kernel without timing again. Built where there
is no GPU, the runtime takes cuDNN's first heuristic choice instead.
"""

from __future__ import annotations

import tvm
from tvm import relax

from collage_core.kit import (
    ChoiceStore, Group, Refused, computes_tf32, cuda_libraries, packed_call_function, pattern_of,
)
from collage_cudnn import library, specs

RUN_FUNCTION = "collage_cudnn.run"
TUNE_FUNCTION = "collage_cudnn.tune"


def _is_plan(value) -> bool:
    return isinstance(value, list) and len(value) >= 2 and all(isinstance(word, int) for word in value) and len(value) == 2 + 2 * value[1]


def _plan(spec: specs.KernelSpec) -> tuple[int, ...]:
    """The fastest plan's engine and knobs for ``spec`` on this GPU (timed once, then remembered), or () without a GPU."""
    store = ChoiceStore(library.cache_dir() / "plans.json", _is_plan)
    tune = tvm.get_global_func(TUNE_FUNCTION)
    return cuda_libraries.tuned_on_gpu(store, spec.words, library.cudnn_version(), lambda: tune(specs.as_text(spec.array())))


def lower_function(func: relax.Function, name: str) -> relax.Function:
    """``func`` with its body replaced by the cuDNN call (the fastest execution plan chosen on this GPU)."""
    library.load()
    try:
        spec = specs.recognize(Group.from_function(func), tf32=computes_tf32(pattern_of(func)))
    except Refused as refused:
        raise ValueError(f"cuDNN partition {name}: {refused}") from None
    return packed_call_function(func, name, RUN_FUNCTION, specs.as_text(spec.array(_plan(spec))), spec.operands)
