"""Tuning partitions' kernels with MetaSchedule, within a budget of seconds, into the device's database.

MetaSchedule counts trials, not seconds: the kernels are tuned in a child process (``python -m
collage_metaschedule.tuning``), one after another, each in rounds of ``TRIALS_PER_ROUND`` trials while its share of
the budget lasts, and the child is killed when the budget is spent. Every measured record is in the database file as
soon as it is measured, so what a killed run measured stays.

Candidates are built and timed in the tuning process itself (``InProcessBuilder``, ``InProcessRunner``), not in
MetaSchedule's pools of fresh Python processes: on a 2-core machine those spent their 30-second limit starting (each
imports TVM and every kind's tensor intrinsics), and every trial failed; they also need psutil.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tvm
from collage_tvm import kernels as tvm_kernels

from collage_core.kit import tvm_compat
from collage_metaschedule import database

# Trials per round of one kernel, and the most trials a kernel gets in one tuning run.
TRIALS_PER_ROUND = 16
MAX_TRIALS_PER_KERNEL = 256
# At most this many distinct kernels are tuned in one run: the first the partitions give, the costliest partition first.
# A model of repeated layers repeats its partitions: kernels already met are passed over, not counted.
MAX_KERNELS = 8
# The least seconds a round is expected to take.
LEAST_ROUND_S = 2.0


# What MetaSchedule's CUDA rules read of a GPU that TVM's "cuda" target leaves out (TVM's device attributes of these
# names), and what every NVIDIA GPU since compute capability 3.0 gives where no GPU is here to ask.
CUDA_LIMITS = {"max_threads_per_block": 1024, "max_shared_memory_per_block": 48 * 1024}


def tuning_target(target: tvm.target.Target) -> tvm.target.Target:
    """``target`` as MetaSchedule's rules need it: a CPU's with ``num-cores`` (this machine's cores when not given);
    a GPU's with its threads and shared memory per block (this GPU's when not given, or every NVIDIA GPU's without one)."""
    spec = tvm_compat.target_to_dict(target)
    if spec.get("kind") == "llvm" and "num-cores" not in spec:
        spec["num-cores"] = os.cpu_count() or 1
    if spec.get("kind") == "cuda":
        gpu = tvm.cuda(0)
        for key, otherwise in CUDA_LIMITS.items():
            spec.setdefault(key, int(getattr(gpu, key)) if gpu.exist else otherwise)
    return tvm.target.Target(spec)


def kernels_to_tune(mod: tvm.IRModule, function_names, target: tvm.target.Target) -> list[tuple[str, object]]:
    """The distinct kernels of the named partitions that have no tuned record yet, in the order the partitions are
    given, at most MAX_KERNELS: (a name saying whose kernel it is, the PrimFunc). Partitions that repeat one already
    read, constants and all (a model's repeated layers), are passed over without being lowered again."""
    db = database.open_database(target)
    found, seen, read = [], set(), set()
    for name in function_names:
        partition_key = tvm_compat.structural_key(mod[name], with_values=True)  # LegalizeOps writes scalars into the TIR
        if partition_key in read:
            continue
        read.add(partition_key)
        for gvar, kernel in tvm_kernels.kernels(tvm_kernels.legalized(mod[name], target)):
            key = tvm_compat.structural_key(database.workload(kernel))
            if key in seen:
                continue
            seen.add(key)
            if database.tuned(db, kernel, target) is None:
                found.append((f"{name}/{gvar.name_hint}", kernel))
                if len(found) == MAX_KERNELS:
                    return found
    return found


def tune(mod: tvm.IRModule, function_names, target: tvm.target.Target, budget_s: float, say=print) -> int:
    """Tune the kernels of the named partitions of ``mod`` that have no record, for at most ``budget_s`` seconds;
    how many of them have one now. ``say`` gets one line per kernel as it is done. One run tunes into a device's
    database at a time: while another holds it, nothing is tuned."""
    started = time.monotonic()
    database.open_database(target)  # a corrupt database is refused before anything is tuned
    wanted = kernels_to_tune(mod, function_names, target)
    if not wanted:
        say("tvm-tuned: every kernel of these partitions is tuned already")
        return 0
    folder = database.prepare_folder(target)
    with database.tuning_lock(folder) as held:
        if not held:
            say(f"tvm-tuned: another run is tuning into {folder}; nothing is tuned now")
            return 0
        say(f"tvm-tuned: tuning {len(wanted)} kernels for at most {budget_s:.0f} s into {folder}")
        _run_child(wanted, target, folder, started, budget_s, say)
    db = database.open_database(target)
    return sum(database.tuned(db, kernel, target) is not None for _, kernel in wanted)


def _run_child(wanted, target: tvm.target.Target, folder: Path, started: float, budget_s: float, say) -> None:
    """Tune ``wanted`` in a child process until ``started + budget_s``."""
    with tempfile.TemporaryDirectory(prefix="collage-tuning-") as scratch:
        spec = Path(scratch) / "kernels.json"
        spec.write_text(
            json.dumps(
                {
                    "kernels": tvm_compat.save_ir_json(tvm.IRModule({f"k{i}": kernel for i, (_, kernel) in enumerate(wanted)})),
                    "names": [name for name, _ in wanted],
                    "target": tvm_compat.target_to_dict(tuning_target(target)),
                    "folder": str(folder),
                    "budget_s": max(budget_s - (time.monotonic() - started), 0.0),
                    "trials_per_round": TRIALS_PER_ROUND,
                    "max_trials_per_kernel": MAX_TRIALS_PER_KERNEL,
                    "work_dir": scratch,
                }
            )
        )
        with open(Path(scratch) / "tuning.log", "wb") as log:
            child = subprocess.Popen(
                [sys.executable, "-m", "collage_metaschedule.tuning", str(spec)],
                stdout=subprocess.PIPE,
                stderr=log,
                env=_environment_for_child(),
            )
            _relay(child, started + budget_s, say)
        if child.returncode not in (0, -9):  # -9: killed at the budget
            said = (Path(scratch) / "tuning.log").read_text(errors="replace").strip().splitlines()
            say(f"tvm-tuned: the tuning process failed ({said[-1] if said else f'exit status {child.returncode}'})")


def _environment_for_child() -> dict:
    """This process's environment, with its import path: the child imports what this process did."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path)
    return env


def _relay(child: subprocess.Popen, deadline: float, say) -> None:
    """Say the child's lines until it ends or the deadline passes; then it is killed (its records are on disk)."""
    import selectors

    with selectors.DefaultSelector() as selector:
        selector.register(child.stdout, selectors.EVENT_READ)
        buffered = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                child.kill()
                say("tvm-tuned: the tuning budget is spent; what was measured is kept")
                break
            if not selector.select(timeout=min(left, 1.0)):
                continue
            chunk = os.read(child.stdout.fileno(), 65536)
            if not chunk:
                break
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                say(line.decode(errors="replace"))
    child.wait()
    child.stdout.close()


def _tune_kernels(spec: dict, progress) -> None:
    """The child's work: each kernel in rounds while its share of the budget lasts."""
    import logging

    from tvm.s_tir import meta_schedule as ms

    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    started = time.monotonic()
    target = tvm.target.Target(spec["target"])
    _import_intrinsics_of(target)
    kernels = tvm_compat.load_ir_json(spec["kernels"])
    folder = Path(spec["folder"])
    db = ms.database.JSONDatabase(path_workload=str(folder / database.WORKLOADS), path_tuning_record=str(folder / database.RECORDS))
    names = spec["names"]
    threads = int(spec["target"].get("num-cores", os.cpu_count() or 1))
    for index, name in enumerate(names):
        kernel = kernels[f"k{index}"]
        left = spec["budget_s"] - (time.monotonic() - started)
        share_end = time.monotonic() + left / (len(names) - index)
        kernel_started, trials, round_s = time.monotonic(), 0, LEAST_ROUND_S
        # A round is started only when one as long as the last one fits in the kernel's share.
        while trials < spec["max_trials_per_kernel"] and share_end - time.monotonic() > round_s:
            round_started = time.monotonic()
            context = ms.TuneContext(
                mod=database.workload(kernel),
                target=target,
                space_generator="post-order-apply",
                search_strategy="evolutionary",
                task_name=name.replace("/", "_"),
                num_threads=threads,
                rand_state=trials + 1,
            ).clone()
            ms.tune.tune_tasks(
                tasks=[context],
                task_weights=[1.0],
                work_dir=spec["work_dir"],
                max_trials_global=spec["trials_per_round"],
                num_trials_per_iter=spec["trials_per_round"],
                database=db,
                builder=_in_process_builder(),
                runner=_in_process_runner(),
                cost_model="random",
            )
            trials += spec["trials_per_round"]
            round_s = max(time.monotonic() - round_started, LEAST_ROUND_S)
        best = database.best_seconds(db, kernel)
        said = "no schedule ran" if best is None else f"best {best * 1e6:.1f} us"
        progress.write(
            f"tvm-tuned: kernel {index + 1}/{len(names)} {name}: {said} after {trials} trials in {time.monotonic() - kernel_started:.0f} s\n"
        )
        progress.flush()


def _import_intrinsics_of(target: tvm.target.Target) -> None:
    """Register the tensor intrinsics of ``target``'s kind only. MetaSchedule imports ``tvm.s_tir.tensor_intrin``,
    whose every kind's TVMScript (CUDA's, ROCm's, Hexagon's, ...) took 27 s to parse on a 2-core Xeon, in every
    tuning process; x86's alone took 0.2 s. The package stands in ``sys.modules`` empty, its modules importable."""
    import importlib
    import types

    import tvm.s_tir

    name = "tvm.s_tir.tensor_intrin"
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = [str(Path(tvm.s_tir.__file__).parent / "tensor_intrin")]
        sys.modules[name] = package
    triple = str(target.attrs.get("mtriple", ""))
    kind = "cuda" if target.kind.name == "cuda" else ("arm_cpu" if triple.startswith("aarch64") else "x86")
    importlib.import_module(f"{name}.{kind}")


def _in_process_builder():
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
    from tvm.s_tir.meta_schedule.builder.local_builder import default_build, default_export

    @derived_object
    class InProcessBuilder(PyBuilder):
        def build(self, build_inputs):
            results = []
            for given in build_inputs:
                try:
                    results.append(BuilderResult(default_export(default_build(given.mod, given.target, None)), None))
                except Exception as error:  # a candidate that does not build is a failed trial, not the end
                    results.append(BuilderResult(None, f"{type(error).__name__}: {error}"))
            return results

    return InProcessBuilder()


def _in_process_runner():
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, PyRunner
    from tvm.s_tir.meta_schedule.runner.local_runner import LocalRunnerFuture, default_alloc_argument
    from tvm.s_tir.meta_schedule.runner.utils import run_evaluator_common

    config = EvaluatorConfig._normalized(EvaluatorConfig(number=3, repeat=1, min_repeat_ms=20, enable_cpu_cache_flush=False))

    @derived_object
    class InProcessRunner(PyRunner):
        def run(self, runner_inputs):
            results = []
            for given in runner_inputs:
                try:
                    module = tvm.runtime.load_module(str(given.artifact_path))
                    device = tvm.runtime.device(str(given.device_type), 0)
                    arguments = default_alloc_argument(device, tuple(info.as_json() for info in given.args_info), 1)
                    results.append(LocalRunnerFuture(res=run_evaluator_common(module, device, config, arguments)))
                except Exception as error:  # a candidate that fails to run is a failed trial
                    results.append(LocalRunnerFuture(error_message=f"{type(error).__name__}: {error}"))
            return results

    return InProcessRunner()


def main(argv=None) -> None:
    """``python -m collage_metaschedule.tuning SPEC``: tune the kernels SPEC names; one line per kernel on stdout."""
    spec = json.loads(Path((argv or sys.argv[1:])[0]).read_text())
    progress = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # MetaSchedule's and TVM's own output goes to the log, not into the lines the parent relays
    _tune_kernels(spec, progress)


if __name__ == "__main__":
    main()
