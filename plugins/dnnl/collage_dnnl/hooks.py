"""oneDNN (DNNL) as a Collage op-level backend on the CPU.

Each partition becomes one call of ``collage_dnnl.run``, a C++ function compiled against
oneDNN's API (``runtime/collage_dnnl.cc``) that creates the partition's primitive once and then
runs it on the VM's tensors in place; no Python runs on that path.
"""

from __future__ import annotations

from pathlib import Path

from collage_core.kit import KERNEL_CACHE_HEADER, OP_LEVEL, Backend, fused_groups, native_kernel_hooks, sources_digest
from collage_dnnl import library, lowering, patterns, specs

BACKEND = patterns.BACKEND
# What decides a measured cost besides oneDNN itself: the kernels, how specs are read, how
# partitions are lowered. Part of the backend's version, so costs measured with other code are never reused.
KERNELS_DIGEST = sources_digest(
    (library.SOURCE, KERNEL_CACHE_HEADER, Path(specs.__file__), Path(lowering.__file__), Path(fused_groups.__file__))
)


def _onednn_version() -> str:
    try:
        return library.find_onednn().version
    except library.OneDNNUnavailable:
        return "not installed"


def _describe() -> Backend:
    return Backend(
        name=BACKEND,
        kind=OP_LEVEL,
        device_kinds=("cpu",),
        version=f"onednn-{_onednn_version()}+kernels-{KERNELS_DIGEST}",
        description="oneDNN primitives (convolution, matmul, pooling, softmax, layer norm) with fused post-ops",
        runtime_needs=f"the collage-dnnl plugin (pip install -e plugins/dnnl) and oneDNN 2.x ({library.INSTALL_HINT})",
        lowering_uses_device=False,  # compiles only: candidates are built several at once
    )


HOOKS = native_kernel_hooks(
    BACKEND,
    describe=_describe,
    load=library.load,
    unavailable=library.OneDNNUnavailable,
    target_kinds=("llvm", "c"),
    patterns=lambda precision: patterns.patterns(),
    lower_function=lowering.lower_function,
    built_library=lambda: library.build(library.find_onednn()),  # exports carry the kernels, linked against oneDNN
)
globals().update(HOOKS.hookimpls())  # collage_register_backends, collage_check_availability, ...
