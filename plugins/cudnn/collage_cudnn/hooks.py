"""cuDNN (its graph API) as a Collage op-level backend on NVIDIA GPUs.

Each partition becomes one call of ``collage_cudnn.run``, a C++ function compiled against cuDNN
and its C++ frontend (``runtime/collage_cudnn.cc``) that executes the partition's operation
graph (a convolution or a matrix product with fused bias, residual add and activation) with
the execution plan chosen by timing at build time, on TVM's CUDA stream; no Python runs on that path.
"""

from __future__ import annotations

from pathlib import Path

from collage_core.kit import (
    KERNEL_CACHE_HEADER, OP_LEVEL, TF32, Availability, Backend, fused_groups, hookimpl, hookimpl_for,
    replace_functions, sources_digest,
)
from collage_cudnn import library, lowering, patterns, specs

BACKEND = patterns.BACKEND
# What decides a measured cost besides cuDNN itself: the kernels, how groups are read, how partitions are lowered.
KERNELS_DIGEST = sources_digest(
    (library.SOURCE, KERNEL_CACHE_HEADER, Path(specs.__file__), Path(lowering.__file__), Path(fused_groups.__file__))
)


@hookimpl
def collage_register_backends(register):
    register(
        Backend(
            name=BACKEND,
            kind=OP_LEVEL,
            device_kinds=("cuda",),
            version=f"cudnn-{library.cudnn_version()}+kernels-{KERNELS_DIGEST}",
            description="cuDNN graphs: conv2d and matrix products with fused bias, residual, ReLU, GELU (erf, tanh), SiLU",
            runtime_needs=f"the collage-cudnn plugin (pip install -e plugins/cudnn), an NVIDIA GPU and {library.INSTALL_HINT}",
        )
    )


@hookimpl_for(BACKEND)
def collage_check_availability(backend):
    try:
        library.load()
    except library.CudnnUnavailable as unavailable:
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
    library.load()  # registers collage_cudnn.run; raises CudnnUnavailable saying what is missing
    return True


@hookimpl_for(BACKEND)
def collage_runtime_libraries(backend):
    return [library.native_library().build()]  # exports carry the kernels (no GPU needed to build them)
