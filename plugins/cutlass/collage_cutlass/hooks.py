"""CUTLASS as a Collage op-level backend on Hopper GPUs: 16-bit matrix products and 2-d convolutions with fused epilogues,
each from a kernel instantiated from CUTLASS's templates, compiled with nvcc and tuned per problem.

Each partition becomes one call of ``collage_cutlass.<kernel>``, a TVM FFI function the kernel's
library registers (``runtime/gemm_runner.h``), launching on TVM's CUDA stream; no Python runs on
that path.
"""

from __future__ import annotations

from pathlib import Path

from collage_core.kit import (
    OP_LEVEL,
    TF32,
    Availability,
    Backend,
    fused_groups,
    hookimpl,
    hookimpl_for,
    replace_functions,
    sources_digest,
    strided_products,
)
from collage_cutlass import conv_kernels, conv_specs, kernels, library, lowering, patterns, specs, tuning

BACKEND = patterns.BACKEND
# What decides a measured cost besides CUTLASS and nvcc: the kernels' sources, how groups are read and lowered.
KERNELS_DIGEST = sources_digest(
    (
        library.COMMON_HEADER,
        library.RUNNER_HEADER,
        library.CONV_RUNNER_HEADER,
        *(Path(module.__file__) for module in (kernels, specs, conv_kernels, conv_specs, tuning, lowering, fused_groups, strided_products)),
    )
)


def _nvcc() -> str:
    try:
        return library.nvcc_version()
    except library.CutlassUnavailable:
        return "none"


@hookimpl
def collage_register_backends(register):
    register(
        Backend(
            name=BACKEND,
            kind=OP_LEVEL,
            device_kinds=("cuda",),
            version=f"cutlass-{library.cutlass_version()}+nvcc-{_nvcc()}+kernels-{KERNELS_DIGEST}",
            description="CUTLASS 3 Hopper GEMMs and implicit-GEMM convolutions (TMA, warp-specialized), bf16/fp16/TF32 with fused bias, residual, ReLU, GELU, SiLU; tuned per problem",
            runtime_needs=f"the collage-cutlass plugin (pip install -e plugins/cutlass), a Hopper GPU and {library.INSTALL_HINT}",
        )
    )


@hookimpl_for(BACKEND)
def collage_check_availability(backend):
    try:
        library.check_gpu()
        library.cutlass_includes()
        library.find_nvcc()
    except library.CutlassUnavailable as unavailable:
        return Availability.no(str(unavailable))
    return Availability.yes()


@hookimpl_for(BACKEND)
def collage_contribute_patterns(backend, target, precision):
    if target.kind.name != "cuda":
        return []
    return patterns.patterns(tf32=precision == TF32)


@hookimpl_for(BACKEND)
def collage_lower_partitions(backend, mod, function_names, target):
    return replace_functions(mod, function_names, lowering.lower_function)


@hookimpl_for(BACKEND)
def collage_prepare_runtime(backend):
    library.check_gpu()
    for kernel in library.chosen_kernels():  # every kernel chosen on this machine: what a library built here calls
        library.load(kernel)
    return True


@hookimpl_for(BACKEND)
def collage_runtime_libraries(backend):
    built = library.build_all(library.chosen_kernels(), progress=False)
    return [path for path in built.values() if isinstance(path, Path)]
