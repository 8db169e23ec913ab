"""CUTLASS as a Collage op-level backend on Hopper GPUs: 16-bit matrix products and 2-d convolutions with fused epilogues,
each from a kernel instantiated from CUTLASS's templates, compiled with nvcc and tuned per problem.

Each partition becomes one call of ``collage_cutlass.<kernel>``, a TVM FFI function the kernel's
library registers (``runtime/gemm_runner.h``), launching on TVM's CUDA stream; no Python runs on
that path.
"""

from __future__ import annotations

from pathlib import Path

from collage_core.kit import OP_LEVEL, TF32, Backend, backend_hooks, fused_groups, reason_raised_by, sources_digest, strided_products
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


def _describe() -> Backend:
    return Backend(
        name=BACKEND,
        kind=OP_LEVEL,
        device_kinds=("cuda",),
        version=f"cutlass-{library.cutlass_version()}+nvcc-{_nvcc()}+kernels-{KERNELS_DIGEST}",
        description="CUTLASS 3 Hopper GEMMs and implicit-GEMM convolutions (TMA, warp-specialized), bf16/fp16/TF32 with fused bias, residual, ReLU, GELU, SiLU; tuned per problem",
        runtime_needs=f"the collage-cutlass plugin (pip install -e plugins/cutlass), a Hopper GPU and {library.INSTALL_HINT}",
    )


def _check_toolchain() -> None:
    """Raise ``CutlassUnavailable`` saying what is missing: a Hopper GPU, CUTLASS's headers or nvcc."""
    library.check_gpu()
    library.cutlass_includes()
    library.find_nvcc()


def _load_chosen_kernels() -> None:
    library.check_gpu()
    for kernel in library.chosen_kernels():  # every kernel chosen on this machine: what a library built here calls
        library.load(kernel)


def _built_libraries() -> list[Path]:
    built = library.build_all(library.chosen_kernels(), progress=False)
    return [path for path in built.values() if isinstance(path, Path)]


HOOKS = backend_hooks(
    BACKEND,
    describe=_describe,
    missing=reason_raised_by(_check_toolchain, library.CutlassUnavailable),
    target_kinds=("cuda",),
    patterns=lambda target, precision: patterns.patterns(tf32=precision == TF32),
    lowering=lambda mod, function_names, target: lowering.lower_function,
    prepare_runtime=_load_chosen_kernels,
    runtime_libraries=_built_libraries,
)
globals().update(HOOKS.hookimpls())  # collage_register_backends, collage_check_availability, ...
