"""TVM's kernels tuned by MetaSchedule as a Collage backend, ``tvm-tuned``, beside the TVM plugin's untuned ones.

Its patterns are the TVM plugin's (one operator, an anchor and its elementwise chain), renamed; a match is a candidate
only when every kernel TVM's pipeline makes of it has a tuned record in this device's database, so the search weighs
a tuned kernel against the untuned one and decides. ``collage_tune_partitions`` fills the database.
"""

from __future__ import annotations

import sys
from pathlib import Path

import tvm
from collage_tvm import hooks as tvm_hooks
from collage_tvm import kernels as tvm_kernels
from tvm import relax

from collage_core.kit import OP_LEVEL, Backend, Pattern, backend_hooks, sources_digest, substitute, tvm_compat
from collage_metaschedule import database, lowering, tuning

BACKEND = "tvm-tuned"
# The backend whose partitions this one tunes: TVM's own code generation, whose patterns it shares.
TUNES = tvm_hooks.BACKEND
# What decides a measured cost besides TVM and the records: how partitions are lowered, here and by the TVM plugin
# (its rewrites run first).
LOWERING_DIGEST = f"{sources_digest(tuple(Path(module.__file__) for module in (lowering, database)))}-{tvm_hooks.LOWERING_DIGEST}"


def _describe() -> Backend:
    return Backend(
        name=BACKEND,
        kind=OP_LEVEL,
        device_kinds=("cpu", "cuda"),
        # The records' digest: a cost measured with fewer records is not read as if measured with more.
        version=f"{tvm.__version__}+lowering-{LOWERING_DIGEST}+records-{database.records_digest()}",
        description="TVM Relax kernels tuned by MetaSchedule (only those with records in this device's tuning database)",
        lowering_uses_device=False,  # compiles only: candidates are built several at once
    )


def _patterns(target, precision) -> list[Pattern]:
    # A corrupt database raises: one warning naming the file, and no tuned candidates. Without a database nothing
    # is tuned on this device yet: no patterns, rather than every match of TVM's refused by its check.
    if database.open_database(target) is None:
        return []
    tuned = _tuned_check(target)
    return [
        Pattern(f"{BACKEND}.{pattern.name.split('.', 1)[1]}", pattern.dpl, _both(pattern.check, tuned))
        for pattern in tvm_hooks.patterns(target, precision)
    ]


def _both(first, then):
    """A check that takes a match when ``first`` (None: any match) and then ``then`` take it."""
    if first is None:
        return then
    return lambda match: bool(first(match)) and then(match)


def _tune_partitions(mod, function_names, target, budget_s) -> int:
    # TVM's own partitions, most costly first as given; the others run on kernels MetaSchedule does not tune.
    names = [name for name in function_names if mod[name].attrs.get("collage.backend") == TUNES]
    if not names:
        return 0
    return tuning.tune(mod, names, target, budget_s, say=_say)


HOOKS = backend_hooks(
    BACKEND,
    describe=_describe,
    missing=lambda: None,  # TVM itself is all it needs
    patterns=_patterns,
    lowering=None,
    lower_module=lowering.lower_partitions,  # adds the tuned kernels to the module beside the partitions calling them
    prepare_runtime=lambda: None,  # the tuned kernels are compiled into the library itself
    runtime_libraries=lambda: [],  # the tuned kernels are compiled into the library itself
    tune_partitions=_tune_partitions,
)
globals().update(HOOKS.hookimpls())  # collage_register_backends, ..., collage_tune_partitions


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _tuned_check(target):
    """A check that takes a match only when every kernel TVM's pipeline makes of it has a tuned record."""
    refused: dict[str, str] = {}  # by the function's structural hash: why it is refused, empty when taken

    def check(match) -> bool:
        db = database.open_database(target)
        func = match_function(match)
        key = tvm_compat.structural_key(func)  # weights' values do not change the kernels
        if key not in refused:
            try:
                lowering.scheduled_kernels(tvm_kernels.legalized(func, target), target, db)
                refused[key] = ""
            except lowering.NotTuned as reason:
                refused[key] = str(reason)
        if refused[key]:
            raise lowering.NotTuned(refused[key])
        return True

    return check


def match_function(match) -> relax.Function:
    """The matched calls as a function, as the core cuts a partition out (``RelaxGraph.region_function``, which a
    check cannot reach): the values read from outside become parameters in order of first use, the group's outputs
    its result. Its kernels are those of the partition the match becomes."""
    inside = set(match.bound_vars)
    # An output bound by glue (``gv = lv1``, a dataflow block's output) stands for the last call's value.
    outputs = [var for var in match.outputs if var in inside] or [match.bound_vars[-1]]
    params, mapping = [], {}

    def visit(node):
        if isinstance(node, relax.Var) and node not in inside and node not in mapping:
            mapping[node] = relax.Var(node.name, tvm_compat.value_type(node))
            params.append(mapping[node])

    for call in match.calls:
        relax.analysis.post_order_visit(call, visit)
    builder = relax.BlockBuilder()
    with builder.function("main", params, private=False):
        with builder.dataflow():
            for var, call in zip(match.bound_vars, match.calls):
                value = substitute(call, mapping)
                emit = builder.emit_output if var in outputs else builder.emit
                mapping[var] = emit(value, name_hint=var.name)
        results = [mapping[var] for var in outputs]
        builder.emit_func_output(results[0] if len(results) == 1 else relax.Tuple(results))
    return builder.get()["main"]
