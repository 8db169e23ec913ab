"""The whole job: import, enumerate, measure, search, build, verify, compare, and keep the result."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import attrs
import numpy as np

from collage_core import tvm_compat
from collage_core.backends import BackendInfo, contribute_patterns, discover_backends, select_backends
from collage_core.candidates import enumerate_candidates
from collage_core.cost_db import CostDatabase, default_cost_db_path
from collage_core.errors import CollageError
from collage_core.measure import MeasurementReport, measure_candidates
from collage_core.model_import import ImportedModel, load_model
from collage_core.partition import partition_module
from collage_core.placement_file import Placement, load_placement
from collage_core.plugins import disabled_plugin_names, get_plugin_manager
from collage_core.records import Candidate, Cost, Partition
from collage_core.relax_graph import RelaxGraph
from collage_core.search import search_op_level
from collage_core.timing import MeasureSettings
from collage_core.verify import Verification, compare_outputs
from collage_core.worker_client import MeasurementWorker, WorkerFailure

PLACEMENT = "placement"
# TVM's own build of the whole model, no partitions: what a user gets from TVM without Collage.
UNPARTITIONED = "unpartitioned relax.build"
# Forces "this backend wherever it can" when a backend cannot cover the model alone.
FALLBACK_PENALTY_S = 1e3


@attrs.frozen
class EndToEnd:
    """The measured latency of one whole build: the chosen placement or a single-backend baseline."""

    name: str
    cost: Cost
    operators_by_backend: dict = attrs.field(eq=False)


@attrs.define
class OptimizedModel:
    """What ``optimize`` returns: the placement, a runnable build, and the measurements behind them."""

    model: ImportedModel
    placement: Placement
    library_path: Path
    target: Any = attrs.field(repr=False)
    end_to_end: list[EndToEnd]
    verification: Optional[Verification]
    measurement: Optional[MeasurementReport]
    candidates: int
    search_s: float
    partitioned_mod: Any = attrs.field(repr=False)
    _vm: Any = attrs.field(default=None, repr=False)

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Run the built placement in this process."""
        import tvm
        from tvm import relax

        if self._vm is None:
            device = tvm_compat.device_for(self.target)
            self._vm = (relax.VirtualMachine(tvm.runtime.load_module(str(self.library_path)), device), device)
        vm, device = self._vm
        result = vm["main"](*[tvm_compat.to_tensor(np.asarray(a), device) for a in inputs])
        return [tvm_compat.to_numpy(o) for o in (result if not hasattr(result, "numpy") else [result])]

    def latency(self, name: str = PLACEMENT) -> Cost:
        return next(e.cost for e in self.end_to_end if e.name == name)

    def save(self, directory: os.PathLike) -> Path:
        """Write ``placement.json``, the compiled library and the report table into ``directory``."""
        from collage_core.report import render_report

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.placement.save(directory / "placement.json")
        library = directory / f"{self.model.name}.so"
        if self.library_path.resolve() != library.resolve():
            shutil.copyfile(self.library_path, library)
        (directory / "report.txt").write_text(render_report(self) + "\n")
        return directory


def optimize(
    model: Any,
    *,
    target: Any = None,
    backends: Optional[Sequence[str]] = None,
    example_inputs: Optional[Sequence[Any]] = None,
    placement: Optional[os.PathLike] = None,
    cost_db: Optional[os.PathLike] = None,
    output_dir: Optional[os.PathLike] = None,
    settings: MeasureSettings = MeasureSettings(),
    compare_backends: bool = True,
    verify: bool = True,
    show_progress: bool = True,
) -> OptimizedModel:
    """Place ``model`` on the fastest mix of ``backends`` (default: every available one) for ``target``.

    ``model`` is an ONNX path or ModelProto, a ``torch.nn.Module`` with ``example_inputs``, or a
    Relax IRModule. With ``placement`` (a placement file) nothing is measured: the file's
    placement is rebuilt. Measured costs are kept in ``cost_db`` (default: the user cache).
    """
    say = _Narrator(show_progress)
    imported = load_model(model, example_inputs)
    target = tvm_compat.make_target(target)
    pm = get_plugin_manager()
    infos = discover_backends(pm)
    for failure in pm.failures:
        say(f"warning: plugin {failure.name}: {failure.reason}")
    chosen = [info for info in select_backends(infos, backends) if _serves(info, target)]
    if not chosen:
        raise CollageError(f"none of the selected backends runs on target {target.kind.name}")
    backend_records = {info.name: info.backend for info in chosen}
    graph = RelaxGraph.from_function(imported.mod["main"])
    say(f"{imported.name}: {len(graph.graph)} operators; backends: {', '.join(backend_records)}; target {target}")
    workdir = Path(output_dir) if output_dir else Path(tempfile.mkdtemp(prefix="collage-"))
    workdir.mkdir(parents=True, exist_ok=True)
    plugin_modules = pm.module_plugin_names()
    disabled = sorted(disabled_plugin_names())

    measurement, candidates, search_s = None, [], 0.0
    if placement is not None:
        chosen_placement = load_placement(placement)
        chosen_placement.check_fits(graph.graph, str(placement))
        missing = sorted({p.backend for p in chosen_placement.partitions} - set(backend_records))
        if missing:
            raise CollageError(f"{placement}: placed on backend(s) not available here: {', '.join(missing)}")
        parts = list(chosen_placement.partitions)
        say(f"replaying {placement}: {len(parts)} partitions, nothing measured")
    else:
        candidates = _all_candidates(pm, graph, chosen, target)
        with CostDatabase.open(Path(cost_db) if cost_db else default_cost_db_path()) as db:
            say(f"{len(candidates)} candidates, {len({c.key for c in candidates})} distinct; cost database {db.path}")
            measurement = measure_candidates(
                graph, candidates, backend_records, target, db, settings, plugin_modules, disabled, show_progress
            )
        say(
            f"measured {measurement.measured} in {measurement.seconds:.1f} s, {measurement.from_database} from the database, "
            f"{measurement.invalid} invalid"
        )
        started = time.perf_counter()
        parts = _searched_parts(graph, candidates, measurement.costs)
        search_s = time.perf_counter() - started
        say(f"op-level search: {len(parts)} partitions in {search_s:.2f} s")
        chosen_placement = _placement(imported, graph, target, chosen, parts)

    partitioned = partition_module(graph, parts)
    inputs = imported.random_inputs()
    library = workdir / f"{imported.name}.so"
    say("building the placement and measuring it end to end")
    outputs, placement_cost = _run_built(partitioned, target, inputs, settings, plugin_modules, disabled, library, workdir)
    verification = None
    if verify and imported.reference is not None:
        verification = compare_outputs(outputs, imported.reference(inputs), imported.reference_name)
        say(verification.describe())
    results = [EndToEnd(PLACEMENT, placement_cost, _operators_by_backend(parts))]
    if compare_backends:
        say(f"building and measuring {UNPARTITIONED}")
        _, cost = _run_built(imported.mod, target, inputs, settings, plugin_modules, disabled, None, workdir)
        results.append(EndToEnd(UNPARTITIONED, cost, {"relax.build": len(graph.graph)}))
    if compare_backends and measurement is not None:
        for info in chosen:
            baseline = _baseline_parts(graph, candidates, measurement.costs, info.name)
            if baseline is None:
                continue
            name, baseline_parts = baseline
            if _same_parts(baseline_parts, parts):
                cost = placement_cost
            else:
                say(f"building and measuring {name}")
                _, cost = _run_built(
                    partition_module(graph, baseline_parts), target, inputs, settings, plugin_modules, disabled, None, workdir
                )
            results.append(EndToEnd(name, cost, _operators_by_backend(baseline_parts)))
    optimized = OptimizedModel(
        imported, chosen_placement, library, target, results, verification, measurement, len(candidates), search_s, partitioned
    )
    if output_dir:
        optimized.save(output_dir)
    return optimized


class _Narrator:
    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __call__(self, message: str) -> None:
        if self.enabled:
            print(message, file=sys.stderr, flush=True)


def _serves(info: BackendInfo, target) -> bool:
    kind = "cpu" if target.kind.name == "llvm" else target.kind.name
    return kind in info.backend.device_kinds


def _all_candidates(pm, graph: RelaxGraph, chosen: Sequence[BackendInfo], target) -> list[Candidate]:
    patterns = [pattern for info in chosen for pattern in contribute_patterns(pm, info.backend, target)]
    return enumerate_candidates(graph, patterns)


def _searched_parts(graph, candidates, costs) -> list[Partition]:
    chosen = search_op_level(graph.graph, candidates, costs)
    return [Partition.from_candidate(candidate, costs[candidate.key]) for candidate in chosen]


def _baseline_parts(graph, candidates, costs, backend: str):
    """The single-backend baseline: ``backend`` alone, or wherever it can with a covering backend for the rest."""
    own = [c for c in candidates if c.backend == backend]
    try:
        return f"{backend} alone", _searched_parts(graph, own, costs)
    except CollageError:
        pass
    for other in sorted({c.backend for c in candidates} - {backend}):
        others = [c for c in candidates if c.backend == other]
        try:
            _searched_parts(graph, others, costs)
        except CollageError:
            continue
        penalized = dict(costs)
        for c in others:
            if costs[c.key].is_measured:
                penalized[c.key] = Cost.measured(costs[c.key].median_s + FALLBACK_PENALTY_S * len(c.nodes), 0.0, 1)
        chosen = search_op_level(graph.graph, own + others, penalized)
        return f"{backend} + {other} for the rest", [Partition.from_candidate(c, costs[c.key]) for c in chosen]
    return None


def _same_parts(first, second) -> bool:
    return sorted((p.backend, p.nodes) for p in first) == sorted((p.backend, p.nodes) for p in second)


def _operators_by_backend(parts) -> dict:
    counts: dict = {}
    for part in parts:
        counts[part.backend] = counts.get(part.backend, 0) + len(part.nodes)
    return counts


def _placement(imported, graph, target, chosen, parts) -> Placement:
    return Placement(
        model_name=imported.name,
        model_fingerprint=imported.fingerprint,
        operators=graph.graph.ops,
        target=tvm_compat.target_to_dict(target),
        device=tvm_compat.device_name(target),
        backends={info.name: {"version": info.backend.version, "kind": info.backend.kind} for info in chosen},
        search="op-level",
        partitions=parts,
    )


def _run_built(mod, target, inputs, settings, plugin_modules, disabled, library, workdir: Path):
    """Build ``mod`` in a fresh worker, run it on ``inputs`` and time it; returns (outputs, cost)."""
    module_path, inputs_path, outputs_path = workdir / "placed.json", workdir / "inputs.npz", workdir / "outputs.npz"
    module_path.write_text(tvm_compat.save_ir_json(mod))
    np.savez(inputs_path, *inputs)
    request = {
        "op": "run_placement",
        "module": str(module_path),
        "target": tvm_compat.target_to_json(target),
        "inputs": str(inputs_path),
        "outputs": str(outputs_path),
        "settings": settings.to_json(),
        "library": str(library) if library else None,
    }
    try:
        with MeasurementWorker(plugin_modules, disabled) as worker:
            response = worker.request(request, settings.timeout_s + 600)
    except WorkerFailure as failure:
        raise CollageError(f"building or running the placement failed: {failure}") from None
    finally:
        module_path.unlink(missing_ok=True)
    with np.load(outputs_path, allow_pickle=False) as saved:
        outputs = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    for path in (inputs_path, outputs_path):
        path.unlink(missing_ok=True)
    return outputs, Cost.from_json(response["cost"])
