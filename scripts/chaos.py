"""Kill Collage at random and check that nothing it kept is lost or half written.

Runs of ``collage optimize`` on the shipped models share one cost database and a few output
folders, two at a time, while this script kills their measurement workers, their zygotes and the
runs themselves (SIGKILL and SIGTERM) after random delays, ``--kills`` times in all. Then it checks:

- the database opens and ``PRAGMA integrity_check`` is ok;
- no cost committed before a kill is lost: the rows are read just before each kill, and every one is
  there after it, and at the end;
- no failure from outside (a worker killed, held up by the machine) is stored as the measured
  thing's own: every invalid cost whose reason names such a failure is marked transient
  (``cost_db.is_transient``). A worker is never killed twice running the same request (whose death
  would then be taken as the request's own, by design): once one of a run's workers is killed, that
  run's workers are spared until a worker started since has ended;
- every artifact of the output folders is whole: placement files load, JSON files parse, the library
  loads and runs on random inputs (in a process of its own);
- a clean rerun of each model into each folder completes with numerics passed, and leaves no
  ``.partial`` file or ``.run-*`` folder, and its ``finished.json`` describes the library beside it;
- no file is left outside the output folders and the database folder: the runs work in a watched
  folder (their working directory and ``TMPDIR``), listed before and after;
- no process of a run outlives it.

It prints one table; its exit status is 0 when every count of trouble is zero and every rerun passed.

    python scripts/chaos.py --kills 50 --seed 0
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("tiny_resnet", "tiny_bert", "tiny_gpt2")
# The kinds of process killed, with how often each is chosen.
KINDS = {"worker": 0.45, "main": 0.35, "zygote": 0.2}
SIGNALS = (signal.SIGKILL, signal.SIGTERM)
# What a failure from outside says in its reason (see collage_core.measure.worker_client).
FROM_OUTSIDE = re.compile(r"SIGKILL|SIGTERM|waiting for a processor")
IN_USE = "is in use by another Collage run"
POLL_S = 0.1
# How long a kind of process chosen to be killed is waited for before another kind is taken.
KIND_WAIT_S = 5.0
# How long a killed process may take to end, and the runs left after the last kill to finish.
DEATH_LIMIT_S = 60.0
# Marks the runs' processes in their environment, so that one that outlives its run is found.
MARK = "COLLAGE_CHAOS_RUN"


# ---------------------------------------------------------------------------------------------
# Processes, from /proc


def process_table() -> dict[int, tuple[int, str, str, str]]:
    """pid -> (parent pid, state, start time in clock ticks, command line) of every process."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = process_stat(int(entry.name))
        try:
            cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # ended meanwhile
        if stat is not None:
            table[int(entry.name)] = (*stat, cmdline)
    return table


def process_stat(pid: int) -> Optional[tuple[int, str, str]]:
    """(parent pid, state, start time in clock ticks) of ``pid``; None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name, in parentheses, may hold spaces
    return int(fields[1]), fields[0], fields[19]


def alive(pid: int, started: str) -> bool:
    """Whether ``pid`` still names the process that started at ``started`` and has not ended."""
    stat = process_stat(pid)
    return stat is not None and stat[2] == started and stat[1] not in ("Z", "X")


def marked_processes(mark: str) -> list[tuple[int, str]]:
    """Processes whose environment carries ``MARK=mark``, with their command lines."""
    found = []
    needle = f"{MARK}={mark}".encode()
    for pid, (_, state, _, cmdline) in process_table().items():
        if state in ("Z", "X") or pid == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append((pid, cmdline))
    return found


# ---------------------------------------------------------------------------------------------
# The runs


class Run:
    """One ``collage optimize`` started by the chaos, and what became of it."""

    def __init__(self, number: int, model: str, folder: Path, arguments: list[str], log: Path, env: dict, cwd: Path):
        self.number, self.model, self.folder, self.arguments, self.log = number, model, folder, arguments, log
        with open(log, "w") as output:
            self.process = subprocess.Popen(arguments, stdout=output, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        self.killed_with: Optional[str] = None
        # Workers alive when one of them was killed, and those started since: the run's workers are
        # spared until one started since has ended (its retry is over).
        self.sparing: Optional[set[int]] = None
        self.started_since: set[int] = set()

    def processes(self, table) -> dict[str, list[int]]:
        """The run's processes by kind: its main process, its zygotes, and its workers."""
        children: dict[int, list[int]] = {}
        for pid, (parent, state, _, _) in table.items():
            if state not in ("Z", "X"):
                children.setdefault(parent, []).append(pid)
        kinds = {"main": [self.process.pid] if self.process.poll() is None else [], "zygote": [], "worker": []}
        for pid in children.get(self.process.pid, []):
            cmdline = table[pid][3]
            if "collage_core.measure.zygote" in cmdline:
                kinds["zygote"].append(pid)
                kinds["worker"].extend(child for child in children.get(pid, []) if "collage_core.measure.zygote" in table[child][3])
            elif "collage_core.measure.worker" in cmdline:
                kinds["worker"].append(pid)
        return kinds

    def watch(self, table) -> None:
        """Follow the retry of a killed worker: once a worker started since it has ended, spare no more."""
        if self.sparing is None:
            return
        workers = set(self.processes(table)["worker"])
        if self.started_since - workers:
            self.sparing = None
            return
        self.started_since |= workers - self.sparing

    def outcome(self) -> str:
        code = self.process.returncode
        text = self.log.read_text(errors="replace")
        if code == 0:
            return "finished"
        if self.killed_with == "SIGTERM" and (code not in (143, -signal.SIGTERM) or "Traceback" in text):
            return "terminated uncleanly"  # not the one line and status 143 of a terminated run
        if self.killed_with is not None:
            return "killed"
        if code == 1 and IN_USE in text:
            return "refused: folder in use"
        return "failed"

    def tail(self) -> str:
        lines = [line for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        return " | ".join(lines[-3:])[-600:]


def run_arguments(rng: random.Random, model: Path, folder: Path, db: Path, backends: str, graph_level: str) -> list[str]:
    """A quick ``collage optimize``, in one of a few shapes so that kills land in every stage."""
    base = [sys.executable, "-m", "collage_core.cli", "optimize", str(model), "--cost-db", str(db), "-o", str(folder)]
    roll = rng.random()
    if graph_level and roll < 0.2:
        # The default two-level search, on a small budget and a seed of its own: new placements to
        # measure end to end in most runs.
        return base + [
            "--backends",
            f"{backends},{graph_level}",
            "--budget",
            "10",
            "--seed",
            str(rng.randrange(10**6)),
            "--calibration-rounds",
            "0",
            "--no-compare",
        ]
    if roll < 0.35:
        return base + ["--backends", backends, "--search", "op-level", "--calibration-rounds", "1", "--no-compare"]
    if roll < 0.45:  # the baselines and the contest in turns
        return base + ["--backends", backends, "--search", "op-level", "--calibration-rounds", "0", "--baseline-limit", "5"]
    return base + quick_arguments(backends)


def quick_arguments(backends: str) -> list[str]:
    return ["--backends", backends, "--search", "op-level", "--calibration-rounds", "0", "--no-compare"]


# ---------------------------------------------------------------------------------------------
# The cost database


def database_rows(db: Path) -> dict[tuple, tuple]:
    """Every stored cost, candidates' and placements', by key: (kind, median_s, reason)."""
    if not db.exists():
        return {}
    for attempt in range(50):
        try:
            connection = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=30)
            try:
                rows = {
                    ("candidate", *row[:5]): row[5:]
                    for row in connection.execute(
                        "SELECT backend, backend_version, target, device, candidate, kind, median_s, reason FROM costs"
                    )
                }
                rows.update(
                    (("end-to-end", row[0]), row[1:])
                    for row in connection.execute("SELECT key, kind, median_s, reason FROM end_to_end_costs")
                )
                return rows
            finally:
                connection.close()
        except sqlite3.OperationalError as error:
            if "no such table" in str(error):  # being created: nothing committed yet
                return {}
            time.sleep(0.1)
    raise RuntimeError(f"cannot read {db}")


def lost_rows(before: dict, after: dict) -> list[tuple]:
    """Rows of ``before`` missing from ``after``, or measured before and no longer."""
    return [key for key, (kind, _, _) in before.items() if key not in after or (kind == "measured" and after[key][0] != "measured")]


def transient_kept_as_permanent(rows: dict) -> list[str]:
    from collage_core.measure.cost_db import TRANSIENT_REASON

    return [
        reason for kind, _, reason in rows.values() if kind == "invalid" and FROM_OUTSIDE.search(reason) and TRANSIENT_REASON not in reason
    ]


def database_problems(db: Path) -> list[str]:
    """Whether the database opens as a cost database and SQLite finds it intact."""
    from collage_core.measure.cost_db import CostDatabase, CostDatabaseError

    problems = []
    try:
        CostDatabase.open(db).close()
    except CostDatabaseError as error:
        problems.append(str(error))
    connection = sqlite3.connect(db)
    try:
        verdict = [row[0] for row in connection.execute("PRAGMA integrity_check")]
    finally:
        connection.close()
    if verdict != ["ok"]:
        problems.append(f"integrity_check: {'; '.join(verdict)[:500]}")
    return problems


# ---------------------------------------------------------------------------------------------
# The output folders


def check_folder(folder: Path, model: Path, after_rerun: bool) -> list[str]:
    """What is not whole in ``folder`` (run in a process of its own: a torn library may crash it);
    after a clean rerun, also leftovers and a finished record that does not describe the library."""
    import numpy as np

    from collage_core.build.deploy import load_vm
    from collage_core.model.model_import import load_model
    from collage_core.outputs.placement_file import PlacementFileError, load_placement

    problems = []
    parsed = {}
    for path in sorted(folder.rglob("*.json")):
        if ".partial" in path.name or any(part.startswith(".run-") for part in path.relative_to(folder).parts):
            continue
        try:
            parsed[path] = json.loads(path.read_text())
        except (ValueError, OSError) as error:
            problems.append(f"{path}: {error}")
    for name in ("placement.json", "searched-placement.json"):
        placements = [folder / name] + (sorted((folder / "baselines").glob("*.json")) if name == "placement.json" else [])
        for path in placements:
            if path in parsed:
                try:
                    load_placement(path)
                except PlacementFileError as error:
                    problems.append(str(error))
    libraries = sorted(path for path in folder.glob("*.so") if not path.name.startswith("."))
    if libraries:
        import tvm

        inputs = load_model(model).random_inputs()
        for library in libraries:
            try:
                outputs = arrays(load_vm(library)["main"](*[tvm.runtime.tensor(array) for array in inputs]))
            except Exception as error:
                problems.append(f"{library}: does not run: {type(error).__name__}: {str(error)[:300]}")
                continue
            if not all(np.isfinite(output).all() for output in outputs):
                problems.append(f"{library}: outputs not finite on random inputs")
    if not after_rerun:
        return problems
    for path in folder.rglob("*"):
        if ".partial" in path.name or path.name.startswith(".run-"):
            problems.append(f"{path}: left over after a clean rerun")
    finished = parsed.get(folder / "finished.json")
    if finished is None:
        problems.append(f"{folder}: no finished.json after a clean rerun")
    else:
        library = folder / finished["library"]["name"]
        if not library.exists() or hashlib.sha256(library.read_bytes()).hexdigest() != finished["library"]["sha256"]:
            problems.append(f"{library}: not the library finished.json describes")
        runtime = parsed.get(library.with_name(library.name + ".runtime.json"))
        if runtime is not None and runtime.get("library") != library.name:
            problems.append(f"{library}.runtime.json names {runtime.get('library')}")
        placement = parsed.get(folder / "placement.json")
        if placement is None or placement.get("model", {}).get("fingerprint") != finished["key"]["model"]:
            problems.append(f"{folder / 'placement.json'}: not the placement of the model finished.json describes")
    return problems


def arrays(returned) -> list:
    """A VM's outputs as numpy arrays: a tensor, or a tuple of them (nested)."""
    if hasattr(returned, "numpy"):
        return [returned.numpy()]
    return [array for item in returned for array in arrays(item)]


def folder_problems(folder: Path, model: Path, after_rerun: bool, env: dict) -> list[str]:
    """:func:`check_folder` in a process of its own; its crash is a problem too."""
    command = [sys.executable, __file__, "--check-folder", str(folder), "--model", str(model)]
    if after_rerun:
        command.append("--after-rerun")
    checked = subprocess.run(command, capture_output=True, text=True, env=env, cwd=env["TMPDIR"])
    if checked.returncode != 0:
        said = checked.stderr.strip().splitlines()
        return [f"{folder}: checking it failed (status {checked.returncode}): {said[-1] if said else ''}"]
    return json.loads(checked.stdout.strip().splitlines()[-1])


def listing(folder: Path, skipped: tuple[Path, ...]) -> set[str]:
    """Every path under ``folder`` but those under ``skipped``."""
    found = set()
    for directory, subdirectories, files in os.walk(folder):
        here = Path(directory)
        subdirectories[:] = [name for name in subdirectories if here / name not in skipped]
        found.update(str((here / name).relative_to(folder)) for name in subdirectories + files)
    return found


# ---------------------------------------------------------------------------------------------
# The chaos


class Chaos:
    def __init__(self, options):
        self.options = options
        self.rng = random.Random(options.seed)
        self.root = Path(options.root).absolute()
        self.watched = self.root / "watched"  # the runs' working directory and TMPDIR live here
        self.db = self.watched / "db" / "costs.sqlite"
        self.outputs = self.watched / "outputs"
        self.logs = self.root / "logs"
        for folder in (self.watched / "tmp", self.db.parent, self.outputs, self.logs, self.root / "check"):
            folder.mkdir(parents=True, exist_ok=True)
        self.mark = f"{os.getpid()}-{options.seed}-{time.time_ns()}"
        self.env = {**os.environ, "TMPDIR": str(self.watched / "tmp"), MARK: self.mark}
        self.check_env = {**os.environ, "TMPDIR": str(self.root / "check")}
        self.runs: list[Run] = []
        self.kills: dict[str, int] = {f"{kind} {sig.name}": 0 for kind in KINDS for sig in SIGNALS}
        self.lost: set[tuple] = set()
        self.seen: dict[tuple, tuple] = {}
        self.slow_deaths: list[str] = []
        self.folders = [self.outputs / f"{model}-{letter}" for model in options.models for letter in "ab"[: options.folders]]

    def live(self) -> list[Run]:
        return [run for run in self.runs if run.process.poll() is None]

    def start_run(self) -> Run:
        folder = self.rng.choice(self.folders)
        model = folder.name.rsplit("-", 1)[0]
        arguments = run_arguments(
            self.rng, ROOT / "models" / f"{model}.onnx", folder, self.db, self.options.backends, self.options.graph_level
        )
        number = len(self.runs)
        run = Run(number, model, folder, arguments, self.logs / f"run-{number}.log", self.env, self.watched)
        self.runs.append(run)
        return run

    def pause(self, seconds: float) -> None:
        """Wait ``seconds``, keeping the lanes full and following the retries of killed workers."""
        deadline = time.monotonic() + seconds
        while True:
            while len(self.live()) < self.options.lanes:
                self.start_run()
            table = process_table()
            for run in self.live():
                run.watch(table)
            if time.monotonic() >= deadline:
                return
            time.sleep(POLL_S)

    def eligible(self) -> dict[str, list[tuple[Run, int]]]:
        """The processes that may be killed now, by kind."""
        table = process_table()
        found = {kind: [] for kind in KINDS}
        for run in self.live():
            run.watch(table)
            for kind, pids in run.processes(table).items():
                if kind == "worker" and run.sparing is not None:
                    continue
                found[kind].extend((run, pid) for pid in pids)
        return found

    def target(self) -> tuple[str, Run, int]:
        """A process to kill: a kind by KINDS' weights, waited for up to KIND_WAIT_S, then any there is."""
        wanted = self.rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        started = time.monotonic()
        while True:
            eligible = self.eligible()
            if eligible[wanted]:
                return (wanted, *self.rng.choice(eligible[wanted]))
            waited = time.monotonic() - started
            there = [kind for kind in KINDS if eligible[kind]]
            if waited > KIND_WAIT_S and there:
                kind = self.rng.choice(there)
                return (kind, *self.rng.choice(eligible[kind]))
            if waited > 300:
                raise RuntimeError("no process to kill for 300 s")
            self.pause(POLL_S)

    def kill_once(self, number: int) -> None:
        self.pause(self.rng.uniform(self.options.min_delay, self.options.max_delay))
        kind, run, pid = self.target()
        sig = self.rng.choice(SIGNALS)
        entry = process_stat(pid)
        if entry is None:
            return self.kill_once(number)  # it ended between the look and the kill: choose again
        if kind == "worker":
            run.sparing = set(run.processes(process_table())["worker"])
            run.started_since = set()
        before = database_rows(self.db)
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return self.kill_once(number)
        if kind == "main":
            run.killed_with = sig.name
        self.kills[f"{kind} {sig.name}"] += 1
        ended = self.wait_gone(pid, entry[2])
        if not ended:
            self.slow_deaths.append(f"{kind} {pid} of run {run.number} still there {DEATH_LIMIT_S:g} s after {sig.name}")
            if kind == "main":  # where it is stuck: `collage` prints every thread's stack on SIGUSR1 (into its log)
                os.kill(pid, signal.SIGUSR1)
                time.sleep(1.0)
            os.kill(pid, signal.SIGKILL)
            self.wait_gone(pid, entry[2])
        after = database_rows(self.db)
        lost = lost_rows(before, after)
        self.lost.update(lost)
        self.seen.update(before)
        print(
            f"kill {number + 1}/{self.options.kills}: {kind} {sig.name} (run {run.number}, {run.model}, pid {pid}); "
            f"{len(after)} costs stored, {len(lost)} lost",
            flush=True,
        )

    def wait_gone(self, pid: int, started: str) -> bool:
        deadline = time.monotonic() + DEATH_LIMIT_S
        while time.monotonic() < deadline:
            for run in self.runs:
                run.process.poll()  # reaps a main process
            if not alive(pid, started):
                return True
            time.sleep(POLL_S / 2)
        return False

    def finish_runs(self) -> None:
        """Let the runs left finish; those still running after ``--grace`` seconds are killed (not counted)."""
        deadline = time.monotonic() + self.options.grace
        while self.live() and time.monotonic() < deadline:
            time.sleep(POLL_S * 5)
        for run in self.live():
            before = database_rows(self.db)
            run.process.kill()
            run.process.wait()
            run.killed_with = "SIGKILL (after the last kill, out of time)"
            self.lost.update(lost_rows(before, database_rows(self.db)))
            self.seen.update(before)
        deadline = time.monotonic() + DEATH_LIMIT_S  # what they started ends with them
        while marked_processes(self.mark) and time.monotonic() < deadline:
            time.sleep(POLL_S * 5)

    def rerun(self, folder: Path) -> tuple[bool, str]:
        model = folder.name.rsplit("-", 1)[0]
        arguments = [
            sys.executable,
            "-m",
            "collage_core.cli",
            "optimize",
            str(ROOT / "models" / f"{model}.onnx"),
            "--cost-db",
            str(self.db),
            "-o",
            str(folder),
            *quick_arguments(self.options.backends),
        ]
        done = subprocess.run(arguments, capture_output=True, text=True, env=self.env, cwd=self.watched)
        passed = done.returncode == 0 and "numerics passed" in done.stdout
        said = (done.stdout + done.stderr).strip().splitlines()
        return passed, f"{folder.name}: exit {done.returncode}, {said[-1] if said else ''}"

    def main(self) -> int:
        started = time.monotonic()
        watched_before = listing(self.watched, (self.outputs, self.db.parent))
        for number in range(self.options.kills):
            self.kill_once(number)
        self.finish_runs()
        outcomes: dict[str, int] = {}
        for run in self.runs:
            outcomes[run.outcome()] = outcomes.get(run.outcome(), 0) + 1
        failed = [
            f"run {run.number} ({' '.join(run.arguments[4:])}): exit {run.process.returncode}: {run.tail()}"
            for run in self.runs
            if run.outcome() == "failed"
        ]
        unclean = [
            f"run {run.number}: exit {run.process.returncode}: {run.tail()}" for run in self.runs if run.outcome() == "terminated uncleanly"
        ]

        rows = database_rows(self.db)
        self.lost.update(lost_rows(self.seen, rows))
        database = database_problems(self.db)
        transient = transient_kept_as_permanent(rows)
        used = [folder for folder in self.folders if folder.exists()]
        torn = [
            problem
            for folder in used
            for problem in folder_problems(folder, ROOT / "models" / f"{folder.name.rsplit('-', 1)[0]}.onnx", False, self.check_env)
        ]
        reruns = [self.rerun(folder) for folder in self.folders]
        torn += [
            problem
            for folder in self.folders
            for problem in folder_problems(folder, ROOT / "models" / f"{folder.name.rsplit('-', 1)[0]}.onnx", True, self.check_env)
        ]
        outlived = marked_processes(self.mark)
        new_files = listing(self.watched, (self.outputs, self.db.parent)) - watched_before
        outside = sorted(new_files)

        table = [
            *((f"kills: {kind}", str(count)) for kind, count in self.kills.items()),
            ("kills in all", str(sum(self.kills.values()))),
            ("runs started", f"{len(self.runs)} ({', '.join(f'{n} {what}' for what, n in sorted(outcomes.items()))})"),
            ("lost costs", str(len(self.lost))),
            ("transient failures kept as permanent", str(len(transient))),
            ("truncated or mismatched artifacts", str(len(torn))),
            ("files outside the output and database folders", str(len(outside))),
            ("reruns passed", f"{sum(passed for passed, _ in reruns)}/{len(reruns)}"),
            ("runs failed otherwise", str(len(failed))),
            ("runs not ending cleanly on SIGTERM", str(len(unclean))),
            ("processes outliving their run", str(len(outlived))),
            ("killed processes slow to end", str(len(self.slow_deaths))),
            ("database", "ok" if not database else "; ".join(database)),
            (
                "costs stored",
                f"{sum(1 for key in rows if key[0] == 'candidate')} candidates, "
                f"{sum(1 for key in rows if key[0] == 'end-to-end')} placements",
            ),
            ("seconds", f"{time.monotonic() - started:.0f}"),
        ]
        width = max(len(name) for name, _ in table)
        print()
        print(f"{'chaos'.ljust(width)}  result")
        print(f"{'-' * width}  {'-' * 6}")
        for name, value in table:
            print(f"{name.ljust(width)}  {value}")
        details = [
            ("lost", [str(key) for key in sorted(self.lost)]),
            ("transient kept as permanent", transient),
            ("artifacts", torn),
            ("outside", outside),
            ("reruns", [text for passed, text in reruns if not passed]),
            ("failed runs", failed),
            ("unclean on SIGTERM", unclean),
            ("outliving", [f"{pid}: {cmdline}" for pid, cmdline in outlived]),
            ("slow to end", self.slow_deaths),
        ]
        for name, items in details:
            for item in items[:20]:
                print(f"{name}: {item}")
        trouble = (
            self.lost
            or transient
            or torn
            or outside
            or failed
            or unclean
            or outlived
            or self.slow_deaths
            or database
            or not all(passed for passed, _ in reruns)
        )
        return 1 if trouble else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=50, help="processes killed in all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names of models/*.onnx")
    parser.add_argument("--backends", default="tvm,dnnl", help="op-level backends of every run")
    parser.add_argument("--graph-level", default="onnxruntime", help="graph-level backend of the occasional two-level run ('' for none)")
    parser.add_argument("--lanes", type=int, default=2, help="runs at once")
    parser.add_argument("--folders", type=int, choices=(1, 2), default=2, help="output folders per model")
    parser.add_argument("--min-delay", type=float, default=0.5, help="least seconds between kills")
    parser.add_argument("--max-delay", type=float, default=12.0, help="most seconds between kills")
    parser.add_argument(
        "--grace", type=float, default=120.0, help="seconds the runs left after the last kill have to finish before they are killed"
    )
    parser.add_argument("--root", help="folder for the database, outputs and logs (default: a new temporary folder)")
    parser.add_argument("--check-folder", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--after-rerun", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.check_folder:
        print(json.dumps(check_folder(Path(options.check_folder), Path(options.model), options.after_rerun)))
        return 0
    options.models = [name.strip() for name in options.models.split(",") if name.strip()]
    unknown = [name for name in options.models if not (ROOT / "models" / f"{name}.onnx").exists()]
    if unknown:
        parser.error(f"no models/{unknown[0]}.onnx")
    options.root = options.root or tempfile.mkdtemp(prefix="collage-chaos-")
    print(f"chaos in {options.root}: {options.kills} kills, seed {options.seed}", flush=True)
    return Chaos(options).main()


if __name__ == "__main__":
    sys.exit(main())
