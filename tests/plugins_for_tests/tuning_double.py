"""A deterministic test double of a backend that tunes (``collage_tune_partitions``), for the tuning stage's logic.

``tuning-double`` takes a single operator only once it is "tuned": the hook records the partitions it was handed,
in order, and "tunes" the operators of the first one, by name, into a file under ``$TUNING_DOUBLE_DIR``; its version
counts them, as a real tuner's changes with its records. Its partitions are left to TVM's build, so a placement on it
runs real kernels. Nothing here measures or tunes anything.
"""

import json
import os
from pathlib import Path

from tvm.relax.dpl import wildcard

from collage_core import Availability, Backend, Pattern, hookimpl
from collage_core.kit import tvm_compat
from collage_core.records import OP_LEVEL, PatternRefused

BACKEND = "tuning-double"


def state_file() -> Path:
    return Path(os.environ["TUNING_DOUBLE_DIR"]) / "tuned.json"


def state() -> dict:
    path = state_file()
    return json.loads(path.read_text()) if path.exists() else {"tuned_ops": [], "handed": []}


@hookimpl
def collage_register_backends(register):
    register(Backend(BACKEND, OP_LEVEL, ("cpu",), f"tuned-{len(state()['tuned_ops'])}", "a test double of a tuning backend"))


@hookimpl
def collage_check_availability(backend):
    return Availability.yes() if backend.name == BACKEND else None


@hookimpl
def collage_contribute_patterns(backend, target):
    if backend.name != BACKEND:
        return None
    tuned = set(state()["tuned_ops"])

    def check(match):
        if tvm_compat.op_name(match.root) not in tuned:
            raise PatternRefused(f"{tvm_compat.op_name(match.root)} is not tuned")
        return True

    return [Pattern(f"{BACKEND}.op", wildcard(), check)]


@hookimpl
def collage_lower_partitions(backend, mod, function_names, target):
    return mod if backend.name == BACKEND else None


@hookimpl
def collage_prepare_runtime(backend):
    return True if backend.name == BACKEND else None  # its partitions are TVM's own kernels: nothing to load


@hookimpl
def collage_tune_partitions(backend, mod, function_names, target, budget_s):
    if backend.name != BACKEND:
        return None
    now = state()
    now["handed"] = list(function_names)
    first = mod[function_names[0]]
    ops = sorted(
        {
            tvm_compat.op_name(binding.value)
            for block in first.body.blocks
            for binding in block.bindings
            if tvm_compat.is_op_call(binding.value)
        }
    )
    now["tuned_ops"] = sorted(set(now["tuned_ops"]) | set(ops))
    state_file().write_text(json.dumps(now))
    return len(ops)
