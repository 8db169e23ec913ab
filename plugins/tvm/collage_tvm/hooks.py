"""TVM's own Relax code generation as a Collage backend: it covers every operator TVM can legalize."""

from __future__ import annotations

from pathlib import Path

import tvm
from tvm.relax.dpl import is_op, wildcard

from collage_core.kit import OP_LEVEL, Backend, Pattern, backend_hooks, fused_groups, replace_functions, sources_digest
from collage_tvm import gpu_schedules, integer_powers, kernels, prepare, reshapes_first, split_parts

BACKEND = "tvm"
# What decides a measured cost besides TVM itself: how partitions are rewritten before TVM builds them, and how their
# kernels are scheduled on GPUs.
LOWERING_DIGEST = sources_digest(
    tuple(Path(module.__file__) for module in (prepare, integer_powers, split_parts, reshapes_first, kernels, gpu_schedules))
)

# Operators TVM's FuseOps makes the anchor of a fused kernel, and the elementwise or broadcast
# operators it folds into the anchor's output loop.
ANCHOR_OPS = ("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv2d_transpose", "relax.matmul")
ELEMENTWISE_UNARY_OPS = (
    "relax.nn.relu",
    "relax.nn.gelu",
    "relax.nn.gelu_tanh",
    "relax.nn.silu",
    "relax.sigmoid",
    "relax.tanh",
    "relax.clip",
    "relax.sqrt",
    "relax.rsqrt",
    "relax.exp",
    "relax.erf",
    "relax.astype",  # a 16-bit model's casts: after a layer norm or a softmax (GPT-2 at bf16: 24 casts, 68 us on an H100)
)
ELEMENTWISE_BINARY_OPS = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")
MAX_FUSED_ELEMENTWISE = 6
# Reductions FuseOps ends in an elementwise epilogue (the cast or the scale after a norm), with their operand counts,
# and how long a chain after them (elementwise operators or reshapes) is offered.
NORM_OPS = (("relax.nn.layer_norm", 3), ("relax.nn.rms_norm", 2), ("relax.nn.softmax", 1))
MAX_AFTER_NORM = 2


def _elementwise_after(producer):
    alternatives = [is_op(op)(producer) for op in ELEMENTWISE_UNARY_OPS]
    for op in ELEMENTWISE_BINARY_OPS:
        alternatives += [is_op(op)(producer, wildcard()), is_op(op)(wildcard(), producer)]
    pattern = alternatives[0]
    for alternative in alternatives[1:]:
        pattern = pattern | alternative
    return pattern


def _any_elementwise():
    alternatives = [is_op(op)(wildcard()) for op in ELEMENTWISE_UNARY_OPS]
    alternatives += [is_op(op)(wildcard(), wildcard()) for op in ELEMENTWISE_BINARY_OPS]
    pattern = alternatives[0]
    for alternative in alternatives[1:]:
        pattern = pattern | alternative
    return pattern


def _fused_patterns() -> list[Pattern]:
    patterns = []
    chain = _any_elementwise()
    for length in range(1, MAX_FUSED_ELEMENTWISE):
        chain = _elementwise_after(chain)
        patterns.append(Pattern(f"{BACKEND}.elementwise{length + 1}", chain))
    for anchor_name in ANCHOR_OPS:
        chain = is_op(anchor_name)(wildcard(), wildcard())
        short = anchor_name.rsplit(".", 1)[1]
        for length in range(1, MAX_FUSED_ELEMENTWISE + 1):
            chain = _elementwise_after(chain)
            patterns.append(Pattern(f"{BACKEND}.{short}_elementwise{length}", chain))
    for norm_name, arity in NORM_OPS:
        chain = is_op(norm_name)(*[wildcard() for _ in range(arity)])
        short = norm_name.rsplit(".", 1)[1]
        for length in range(1, MAX_AFTER_NORM + 1):  # a reshape may come between (GPT-2: norm, reshape, cast)
            chain = _elementwise_after(chain) | fused_groups.reshape_pattern(chain)
            patterns.append(Pattern(f"{BACKEND}.{short}_elementwise{length}", chain))
    return patterns


def _describe() -> Backend:
    return Backend(
        name=BACKEND,
        kind=OP_LEVEL,
        device_kinds=("cpu", "cuda"),
        version=f"{tvm.__version__}+lowering-{LOWERING_DIGEST}",
        description="TVM Relax code generation (untuned loops on CPU; dlight schedules on GPU, one warp per short row)",
        lowering_uses_device=False,  # compiles only: candidates are built several at once
        compiles_regions=True,  # FuseOps fuses across what were partition boundaries
        builds_whole_models=True,  # relax.build of the unpartitioned model: the baseline the others are measured against
    )


def patterns(target, precision) -> list[Pattern]:
    """TVM's patterns (one operator; an anchor, a norm or an elementwise operator and the elementwise chain after it),
    which the tvm-tuned backend shares."""
    single_operator = Pattern(f"{BACKEND}.op", wildcard())
    return [single_operator, *_fused_patterns()]


def _lower_function(func, name):
    # TVM's own pipeline lowers plain Relax functions; FuseOps works inside each partition
    # function, so fusion never crosses a partition boundary. It is rewritten first (collage_tvm.prepare).
    return prepare.prepared(func)


def _lower_module(mod, function_names, target):
    """On a GPU, each partition's kernels scheduled by the plugin's rules (:mod:`collage_tvm.gpu_schedules`), as TVM's
    pipeline would fuse them (:mod:`collage_tvm.kernels`); elsewhere the rewritten partitions, for the outer build."""
    if "gpu" in target.keys:
        return kernels.lower_partitions(mod, function_names, target, lambda inner: gpu_schedules.scheduled(inner, target))
    return replace_functions(mod, function_names, _lower_function)


HOOKS = backend_hooks(
    BACKEND,
    describe=_describe,
    missing=lambda: None,  # TVM itself is all it needs
    patterns=patterns,
    lowering=None,
    lower_module=_lower_module,
    prepare_runtime=lambda: None,  # TVM's kernels are compiled into the library itself
    runtime_libraries=lambda: [],  # TVM's kernels are compiled into the library itself
)
globals().update(HOOKS.hookimpls())  # collage_register_backends, collage_check_availability, ...
