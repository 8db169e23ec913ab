"""Measuring candidates: once per distinct structure, in worker processes, remembered in the cost database."""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Sequence

import attrs

from collage_core import tvm_compat
from collage_core.cost_db import CostDatabase, CostKey
from collage_core.progress import ProgressBar
from collage_core.records import Candidate, Cost
from collage_core.relax_graph import RelaxGraph
from collage_core.timing import MeasureSettings
from collage_core.worker_client import MeasurementWorker, WorkerFailure

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


def cost_key(backend, target, candidate_key: str) -> CostKey:
    return CostKey(
        backend=backend.name,
        backend_version=backend.version,
        target=tvm_compat.target_to_json(target),
        device=tvm_compat.device_name(target),
        candidate=candidate_key,
    )


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
) -> MeasurementReport:
    """Cost of every distinct candidate: from ``db`` when known, else measured and stored at once.

    Each backend's candidates are measured in a worker process of their own; a candidate whose
    build fails, crashes or hangs gets an invalid cost with the reason.
    """
    started = time.perf_counter()
    representatives: dict[str, Candidate] = {}
    for candidate in candidates:
        representatives.setdefault(candidate.key, candidate)
    keys = {key: cost_key(backends[c.backend], target, key) for key, c in representatives.items()}
    known = db.get_many(keys.values())
    costs = {key: known[db_key] for key, db_key in keys.items() if db_key in known}
    missing = [representatives[key] for key in sorted(representatives) if key not in costs]
    by_backend: dict[str, list[Candidate]] = {}
    for candidate in sorted(missing, key=lambda c: (c.backend, c.sort_key)):
        by_backend.setdefault(candidate.backend, []).append(candidate)
    with ProgressBar(len(missing), "measuring", enabled=show_progress) as bar, tempfile.TemporaryDirectory() as tmp:
        for backend_name, todo in by_backend.items():
            with MeasurementWorker(plugin_modules, disabled) as worker:
                for candidate in todo:
                    cost = _measure_one(worker, graph, candidate, target, settings, Path(tmp))
                    db.put(keys[candidate.key], cost)
                    costs[candidate.key] = cost
                    shown = f"{cost.median_s * 1e3:.3f} ms" if cost.is_measured else f"invalid: {cost.reason[:60]}"
                    bar.advance(f"{candidate.pattern} ({len(candidate.nodes)} ops): {shown}")
    return MeasurementReport(
        costs=costs,
        distinct=len(representatives),
        from_database=len(representatives) - len(missing),
        measured=len(missing),
        invalid=sum(1 for key in representatives if not costs[key].is_measured),
        seconds=time.perf_counter() - started,
    )


def _measure_one(worker, graph, candidate, target, settings, tmp: Path) -> Cost:
    module_path = tmp / "candidate.json"
    try:
        module_path.write_text(tvm_compat.save_ir_json(graph.standalone_module(candidate.nodes)))
    except Exception as error:
        return Cost.invalid(f"cannot cut out the candidate: {type(error).__name__}: {error}")
    request = {
        "op": "measure_candidate",
        "backend": candidate.backend,
        "pattern": candidate.pattern,
        "module": str(module_path),
        "target": tvm_compat.target_to_json(target),
        "settings": settings.to_json(),
    }
    try:
        response = worker.request(request, settings.timeout_s)
    except WorkerFailure as failure:
        log.warning("%s candidate %s: %s", candidate.backend, candidate.key, failure)
        return Cost.invalid(str(failure))
    return Cost.from_json(response["cost"])

