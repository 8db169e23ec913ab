"""Measuring candidates: once per distinct structure, in worker processes, remembered in the cost database."""

from __future__ import annotations

import contextlib
import logging
import queue
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

import attrs

from collage_core import tvm_compat
from collage_core.errors import reraise_interrupt
from collage_core.measure import threads
from collage_core.measure.cost_db import CostDatabase, CostDatabaseError, CostKey
from collage_core.measure.progress import ProgressBar
from collage_core.measure.remote import RemotePool
from collage_core.measure.timing import MeasureSettings
from collage_core.measure.worker import OUT_OF_GPU_MEMORY_REASON
from collage_core.measure.worker_client import START_TIMEOUT_S, MeasurementWorker, TransientFailure, WorkerFailure
from collage_core.model.relax_graph import RelaxGraph
from collage_core.records import Candidate, Cost

log = logging.getLogger("collage")


@attrs.frozen
class MeasurementReport:
    """Costs by candidate key, and how they were obtained."""

    costs: dict = attrs.field(eq=False)
    distinct: int
    from_database: int
    measured: int
    invalid: int
    seconds: float
    # Candidates (keys) whose cost stayed noisy after a second measurement: used as measured.
    noisy: tuple = ()
    # Candidates (keys) whose cost was timed while other processes kept their threads waiting for a processor,
    # twice in this run or in the run that stored it: used as measured, and may be too high.
    held_up: tuple = ()
    # The remote servers that measured candidates (``host:port``), when measured on other machines.
    servers: tuple = ()


# A cost whose interquartile range exceeds this many times the settings' target spread is measured
# again, and the steadier of the two is kept.
NOISY_FACTOR = 4.0


def is_noisy(cost: Cost, settings: MeasureSettings) -> bool:
    """Whether ``cost`` spread far above the goal (a cost of one run has no spread to judge)."""
    return cost.is_measured and cost.repeats > 1 and cost.spread_s > NOISY_FACTOR * settings.target_spread * cost.median_s


def _steadier(first: Cost, second: Optional[Cost]) -> Cost:
    if second is None or not second.is_measured:
        return first
    return min((first, second), key=lambda cost: cost.spread_s / max(cost.median_s, 1e-12))


# How long to wait before timing again a candidate whose timing other processes held up: long enough for a
# burst of another run's work (a build) to pass.
HELD_UP_PAUSE_S = 1.0


def _held_up(costs: dict) -> tuple:
    return tuple(sorted(key for key, cost in costs.items() if cost.held_up))


def _less_held_up(first: Cost, second: Cost) -> Cost:
    """Of two timings of one candidate, one that was not held up, else the faster: load only adds time."""
    timings = [cost for cost in (first, second) if cost.is_measured]
    if not timings:
        return first
    return min(timings, key=lambda cost: (cost.held_up, cost.median_s))


# A candidate whose run (after the warm-up) takes longer than this many times the cheapest known way to
# compute the same operators is not timed further: its cost is that one run (``repeats`` 1). The
# op-level search never picks it, and repeating runs of seconds costs minutes: on BERT-base (2 cores)
# nine untuned TVM matrix products ran 1.4 s each against oneDNN's fractions of a millisecond and took
# 12 s each to time.
CANDIDATE_CUTOFF_FACTOR = 10.0


class KnownAlternatives:
    """The cheapest measured way to compute a set of operators so far: a candidate of exactly those
    operators, or one single-operator candidate for each of them, summed."""

    def __init__(self):
        self.exact: dict[frozenset, float] = {}

    def add(self, candidate: Candidate, cost: Cost) -> None:
        if cost.is_measured:
            nodes = frozenset(candidate.nodes)
            self.exact[nodes] = min(self.exact.get(nodes, float("inf")), cost.median_s)

    def cheapest(self, nodes) -> Optional[float]:
        """Seconds for the cheapest known way to compute ``nodes`` (None if some operator has none yet)."""
        nodes = frozenset(nodes)
        singles = [self.exact.get(frozenset([node])) for node in nodes]
        options = [self.exact.get(nodes)] + ([sum(singles)] if None not in singles else [])
        known = [option for option in options if option is not None]
        return min(known) if known else None

    def cutoff_s(self, candidate: Candidate) -> Optional[float]:
        cheapest = self.cheapest(candidate.nodes)
        return None if cheapest is None else CANDIDATE_CUTOFF_FACTOR * cheapest


# How a candidate is measured; part of its key, so a change of method measures again.
# "net-of-call-1": timed through the VM, less the VM's call overhead (see worker._call_overhead_s).
CANDIDATE_PROTOCOL = "net-of-call-1"


def cost_key(backend, target, candidate_key: str, remote: bool = False) -> CostKey:
    return CostKey(
        backend=backend.name,
        backend_version=backend.version,
        target=tvm_compat.target_to_json(target),
        device=" ".join(filter(None, [tvm_compat.device_name(target), threads_key_part(target, remote)])),
        candidate=f"{CANDIDATE_PROTOCOL}:{candidate_key}",
    )


def threads_key_part(target, remote: bool = False) -> str:
    """What this process's thread settings add to the keys of costs measured on ``target``
    (``threads.key_part``); nothing on a GPU, whose kernels do not run on the CPU's pools, nor on a
    remote server, which runs with its machine's defaults (see :mod:`collage_core.measure.remote`)."""
    return "" if tvm_compat.is_cuda(target) or remote else threads.key_part()


def measure_candidates(
    graph: RelaxGraph,
    candidates: Sequence[Candidate],
    backends: dict,
    target,
    db: CostDatabase,
    settings: MeasureSettings,
    plugin_modules: Sequence[str],
    disabled: Sequence[str] = (),
    show_progress: bool = True,
    remote=None,
) -> MeasurementReport:
    """Cost of every distinct candidate: from ``db`` when known, else measured and stored at once.

    Each backend's candidates are measured in a worker process of their own, single operators first; a candidate whose
    build fails, crashes or hangs gets an invalid cost with the reason. A candidate whose run takes
    more than CANDIDATE_CUTOFF_FACTOR times the cheapest way already measured to compute its operators is
    timed by that one run. Candidates of backends whose
    lowering runs nothing on the device are built ``settings.parallel_builds()`` at a time first
    (when that is more than one), then timed one by one like the rest.

    Runs sharing ``db`` divide the work: each candidate is claimed (or found measured) just before
    it is measured, one claimed by another run is left to it, and its cost is waited for at the end.

    With ``remote`` (:class:`collage_core.measure.remote.RemoteServers`), candidates are built here and timed on
    the remote servers, all at once (:func:`_measure_remotely`).
    """
    started = time.perf_counter()
    representatives: dict[str, Candidate] = {}
    for candidate in candidates:
        representatives.setdefault(candidate.key, candidate)
    keys = {key: cost_key(backends[c.backend], target, key, remote is not None) for key, c in representatives.items()}
    known = db.get_many(keys.values())
    costs = {key: known[db_key] for key, db_key in keys.items() if db_key in known}
    missing = sorted(
        (representatives[key] for key in representatives if key not in costs), key=lambda c: (c.backend, len(c.nodes), c.sort_key)
    )
    alternatives = KnownAlternatives()
    for key, cost in costs.items():
        alternatives.add(representatives[key], cost)
    workers = settings.parallel_builds()
    if remote is not None:
        servers: list[str] = []
        measured = _measure_remotely(
            representatives,
            missing,
            keys,
            costs,
            graph,
            backends,
            target,
            db,
            settings,
            plugin_modules,
            disabled,
            show_progress,
            remote,
            servers,
        )
        return MeasurementReport(
            costs=costs,
            distinct=len(representatives),
            from_database=len(representatives) - measured,
            measured=measured,
            invalid=sum(1 for key in representatives if not costs[key].is_measured),
            seconds=time.perf_counter() - started,
            servers=tuple(sorted(set(servers))),
            held_up=_held_up(costs),
        )
    noisy: list[str] = []
    measured: list[str] = []
    parallel = [c for c in missing if not backends[c.backend].lowering_uses_device] if workers > 1 else []
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        stack.callback(_release_claims, db)
        # Those built at once are claimed before their build: a run holds them until all are built and timed.
        built_lifetime_s = (len(parallel) + 4) * claim_lifetime_s(settings)
        ours = {c.key for c in parallel if db.claim(keys[c.key], built_lifetime_s).granted}
        libraries, failed = _build_in_parallel(
            [c for c in parallel if c.key in ours], graph, target, settings, plugin_modules, disabled, tmp, workers, show_progress
        )
        bar = stack.enter_context(ProgressBar(len(missing), "measuring", enabled=show_progress))
        measuring = {
            name: stack.enter_context(MeasurementWorker(plugin_modules, disabled)) for name in dict.fromkeys(c.backend for c in missing)
        }
        in_use: Optional[MeasurementWorker] = None
        todo, left_to_others = list(missing), []
        while todo or left_to_others:
            if not todo:  # what is left is being measured by other runs: look again in a while
                time.sleep(CLAIM_POLL_S)
                todo, left_to_others = left_to_others, []
            candidate = todo.pop(0)
            if candidate.key not in ours:
                claim = db.claim(keys[candidate.key], claim_lifetime_s(settings))
                if claim.cost is not None:
                    costs[candidate.key] = claim.cost
                    alternatives.add(candidate, claim.cost)
                    bar.advance(f"{candidate.pattern} ({len(candidate.nodes)} ops): measured by another run")
                    continue
                if not claim.granted:
                    left_to_others.append(candidate)
                    continue
            worker = measuring[candidate.backend]
            if in_use is not None and in_use is not worker:
                in_use.close()  # one worker at a time: the idle one would only take memory
            in_use = worker
            if candidate.key in failed:
                cost = failed[candidate.key]
            else:
                timing = attrs.evolve(settings, cutoff_s=alternatives.cutoff_s(candidate))

                def measure():
                    if candidate.key in libraries:
                        module, library = libraries[candidate.key]
                        return _send(worker, candidate, module, target, timing, {"op": "time_candidate", "library": str(library)})
                    return _measure_one(worker, graph, candidate, target, timing, tmp)

                cost = measure()
                if cost.held_up:  # other processes kept its threads waiting: once more, after a pause
                    time.sleep(HELD_UP_PAUSE_S)
                    cost = _less_held_up(cost, measure())
                if is_noisy(cost, settings):
                    cost = _steadier(cost, measure())
                    if is_noisy(cost, settings):
                        noisy.append(candidate.key)
                if not cost.is_measured:
                    # A candidate that failed may leave its process unusable (a faulting GPU
                    # kernel poisons the CUDA context): the next one gets a fresh worker.
                    worker.close()
            if cost.reason.startswith(OUT_OF_GPU_MEMORY_REASON):
                db.release(keys[candidate.key])  # memory another process held is not the candidate's fault
            else:
                db.put(keys[candidate.key], cost)
            costs[candidate.key] = cost
            measured.append(candidate.key)
            alternatives.add(candidate, cost)
            shown = f"{cost.median_s * 1e3:.3f} ms" if cost.is_measured else f"invalid: {cost.reason[:60]}"
            if cost.is_measured and cost.repeats == 1:
                shown += f" (one run, over {CANDIDATE_CUTOFF_FACTOR:g}x the cheapest known)"
            if cost.held_up:
                shown += f" (held up: its threads waited for a processor {cost.held_up_share:.0%} of its time, summed)"
            bar.advance(f"{candidate.pattern} ({len(candidate.nodes)} ops): {shown}")
    return MeasurementReport(
        costs=costs,
        distinct=len(representatives),
        from_database=len(representatives) - len(measured),
        measured=len(measured),
        invalid=sum(1 for key in representatives if not costs[key].is_measured),
        seconds=time.perf_counter() - started,
        noisy=tuple(noisy),
        held_up=_held_up(costs),
    )


def _release_claims(db: CostDatabase) -> None:
    """Give up the claims left when measuring stops early (an interrupt). They lapse with this
    process anyway, so a database that cannot be written now costs nothing."""
    with contextlib.suppress(CostDatabaseError):
        db.release_claims()


# How often a run waiting for the candidates other runs are measuring looks again.
CLAIM_POLL_S = 0.25


def claim_lifetime_s(settings: MeasureSettings) -> float:
    """The longest measuring one candidate may take, and so its claim: again when held up by other processes (after
    HELD_UP_PAUSE_S), again when its cost is noisy, each time once more after a transient failure, each in a worker
    that may have to start first."""
    return 6 * (settings.timeout_s + START_TIMEOUT_S) + HELD_UP_PAUSE_S


def _build_in_parallel(
    todo, graph, target, settings, plugin_modules, disabled, tmp: Path, workers: int, show_progress: bool, on_built=None
) -> tuple[dict, dict]:
    """Build ``todo`` into libraries in ``workers`` worker processes at once, to be timed afterwards
    one by one, so that no build runs while a candidate is timed. Returns (module and library by
    candidate key, invalid cost by key of those that could not be cut out or built). ``on_built(candidate)``
    is called as each library is written (timed elsewhere meanwhile: on remote servers)."""
    modules, failed = {}, {}
    for index, candidate in enumerate(todo):  # here: cutting out is not safe in several threads at once
        path = tmp / f"candidate-{index}.json"
        cost = _cut_out(graph, candidate, path)
        if cost is None:
            modules[candidate.key] = path
        else:
            failed[candidate.key] = cost
    pending = [c for c in todo if c.key in modules]
    libraries, lock = {}, threading.Lock()
    bar = ProgressBar(len(pending), f"building candidates, {workers} at once", enabled=show_progress)

    def build_some() -> None:
        with MeasurementWorker(plugin_modules, disabled) as worker:
            while True:
                with lock:
                    if not pending:
                        return
                    candidate = pending.pop(0)
                library = modules[candidate.key].with_suffix(".so")
                cost = _send(
                    worker, candidate, modules[candidate.key], target, settings, {"op": "build_candidate", "library": str(library)}
                )
                with lock:
                    if cost is None:
                        libraries[candidate.key] = (modules[candidate.key], library)
                    else:
                        failed[candidate.key] = cost
                    bar.advance(candidate.pattern)
                if cost is None and on_built is not None:
                    on_built(candidate, modules[candidate.key], library)

    threads = [threading.Thread(target=build_some, daemon=True) for _ in range(min(workers, len(pending)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    bar.close()
    return libraries, failed


def _measure_one(worker, graph, candidate, target, settings, tmp: Path) -> Cost:
    module_path = tmp / "candidate.json"
    failed = _cut_out(graph, candidate, module_path)
    return failed or _send(worker, candidate, module_path, target, settings, {"op": "measure_candidate"})


def _cut_out(graph, candidate, module_path: Path) -> Optional[Cost]:
    """Write ``candidate`` cut out of ``graph`` as a module to ``module_path``; an invalid cost if it cannot be."""
    try:
        module_path.write_text(tvm_compat.save_ir_json(graph.standalone_module(candidate.nodes)))
    except Exception as error:
        reraise_interrupt(error)
        return Cost.invalid(f"cannot cut out the candidate: {type(error).__name__}: {error}")
    return None


def _send(worker, candidate, module_path: Path, target, settings, extra: dict) -> Optional[Cost]:
    """Send ``candidate``'s module to ``worker`` with ``extra``; the cost it answers, an invalid cost
    when it failed, or None when it answered without one (a build)."""
    request = {
        "what": f"{candidate.backend} candidate {candidate.key}",
        "backend": candidate.backend,
        "pattern": candidate.pattern,
        "module": str(module_path),
        "target": tvm_compat.target_to_json(target),
        "settings": settings.to_json(),
        **extra,
    }
    try:
        response = worker.request(request, settings.timeout_s)
    except WorkerFailure as failure:
        if not isinstance(failure, TransientFailure):  # the worker client named those already
            log.warning("%s candidate %s: %s", candidate.backend, candidate.key, failure)
        return Cost.invalid(str(failure))
    return Cost.from_json(response["cost"]) if "cost" in response else None


def _measure_remotely(
    representatives, missing, keys, costs, graph, backends, target, db, settings, plugin_modules, disabled, show_progress, remote, servers
) -> int:
    """Build ``missing`` here, several at once, each timed on a remote server as soon as it is built, every free
    server at once (:class:`collage_core.measure.remote.RemotePool`); their costs go to ``costs`` and ``db``, the
    servers that measured them to ``servers``. How many were measured. A candidate's cut-off is the cheapest alternative known when a server takes it; one another run
    claimed is measured here too."""
    alternatives = KnownAlternatives()
    for key, cost in costs.items():
        alternatives.add(representatives[key], cost)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        stack.callback(_release_claims, db)
        todo = []
        for candidate in missing:
            claim = db.claim(keys[candidate.key], (len(missing) + 4) * claim_lifetime_s(settings))
            if claim.cost is not None:
                costs[candidate.key] = claim.cost
                alternatives.add(candidate, claim.cost)
            else:
                todo.append(candidate)
        built: dict = {}
        finished: "queue.Queue" = queue.Queue()

        def request_for(candidate) -> dict:
            module, library = built[candidate.key]
            return {
                "op": "time_remote",
                "what": f"{candidate.backend} candidate {candidate.key}",
                "backend": candidate.backend,
                "pattern": candidate.pattern,
                "module": str(module),
                "library": str(library),
                "target": tvm_compat.target_to_json(target),
                "settings": attrs.evolve(settings, cutoff_s=alternatives.cutoff_s(candidate)).to_json(),
                "carried": [str(path) for path in remote.carried.get(candidate.backend, ())],
            }

        pool = RemotePool(
            remote,
            plugin_modules,
            disabled,
            request_for,
            lambda candidate, response, reason: finished.put(
                (candidate, Cost.from_json(response["cost"]) if response else Cost.invalid(reason), (response or {}).get("server"))
            ),
            settings.timeout_s,
        ).start()

        def on_built(candidate, module, library) -> None:
            built[candidate.key] = (module, library)
            pool.add(candidate)

        def build_then_finish() -> None:
            try:
                _, failed = _build_in_parallel(
                    todo, graph, target, settings, plugin_modules, disabled, tmp, settings.parallel_builds(), False, on_built
                )
                for candidate in todo:
                    if candidate.key in failed:
                        finished.put((candidate, failed[candidate.key], None))
            finally:
                pool.join()

        threading.Thread(target=build_then_finish, daemon=True).start()
        bar = stack.enter_context(ProgressBar(len(todo), f"measuring on the servers of {remote.key}", enabled=show_progress))
        for _ in todo:
            candidate, cost, server = finished.get()
            servers += [server] if server else []
            db.put(keys[candidate.key], cost)
            costs[candidate.key] = cost
            alternatives.add(candidate, cost)
            shown = f"{cost.median_s * 1e3:.3f} ms" if cost.is_measured else f"invalid: {cost.reason[:60]}"
            bar.advance(f"{candidate.pattern} ({len(candidate.nodes)} ops): {shown}{f' on {server}' if server else ''}")
    return len(todo)
