"""cuBLAS (cuBLASLt) as a Collage op-level backend on NVIDIA GPUs.

Each partition becomes one call of ``collage_cublas.run``, a C++ function compiled against
cuBLASLt (``runtime/collage_cublas.cc``) that launches the partition's matrix product with its
fused epilogue on TVM's CUDA stream; no Python runs on that path.
"""

from __future__ import annotations

from pathlib import Path

from collage_core.kit import (
    FP32,
    KERNEL_CACHE_HEADER,
    OP_LEVEL,
    TF32,
    Backend,
    bf16_split,
    fused_groups,
    native_kernel_hooks,
    sources_digest,
)
from collage_cublas import library, lowering, patterns, specs

BACKEND = patterns.BACKEND
# What decides a measured cost besides cuBLAS itself: the kernels, how groups are read, how partitions are lowered.
KERNELS_DIGEST = sources_digest(
    (
        library.SOURCE,
        KERNEL_CACHE_HEADER,
        Path(specs.__file__),
        Path(lowering.__file__),
        Path(fused_groups.__file__),
        Path(bf16_split.__file__),
    )
)


def _describe() -> Backend:
    return Backend(
        name=BACKEND,
        kind=OP_LEVEL,
        device_kinds=("cuda",),
        version=f"cublas-{library.cublas_version()}+kernels-{KERNELS_DIGEST}",
        description="cuBLASLt matrix products (dense and batched, transposes as strides) with fused bias, residual, ReLU, tanh GELU",
        runtime_needs=f"the collage-cublas plugin (pip install -e plugins/cublas), an NVIDIA GPU and {library.INSTALL_HINT}",
    )


HOOKS = native_kernel_hooks(
    BACKEND,
    describe=_describe,
    load=library.load,
    unavailable=library.CublasUnavailable,
    target_kinds=("cuda",),
    # float32 products as six bfloat16 ones keep float32's accuracy within a small factor: offered wherever float32 products are
    patterns=lambda precision: patterns.patterns(tf32=precision == TF32, bf16x6=precision in (FP32, TF32)),
    lower_function=lowering.lower_function,
    built_library=lambda: library.native_library().build(),  # exports carry the kernels (no GPU needed to build them)
)
globals().update(HOOKS.hookimpls())  # collage_register_backends, collage_check_availability, ...
