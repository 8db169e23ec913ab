"""The whole job: import, enumerate, measure, search, build, verify, compare, and keep the result."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Optional, Sequence

import attrs
import numpy as np

from collage_core import tvm_compat, zygote
from collage_core.backends import BackendInfo, contribute_patterns, discover_backends, select_backends, serves
from collage_core.baselines import (
    IN_TURNS, TURNS_MARGIN, baseline_file, closest_rivals, faster_baseline, op_groups, operators_by_backend,
    predicted_cost, searched_parts, single_backend_parts,
)
from collage_core.calibration import DEFAULT_ROUNDS, calibrate, signature
from collage_core.candidates import enumerate_candidates
from collage_core.cost_db import CostDatabase, default_cost_db_path
from collage_core.deploy import backend_needs, runtime_file, write_runtime_file
from collage_core.errors import CollageError
from collage_core.finished_build import FinishedBuild, finish_key, load_finished, save_finished
from collage_core.in_turns import time_in_turns
from collage_core.measure import MeasurementReport, measure_candidates
from collage_core.model_import import ImportedModel, load_model
from collage_core.partition import partition_module
from collage_core.placement_file import Placement, load_placement
from collage_core.plugins import disabled_plugin_names, get_plugin_manager
from collage_core.progress import ProgressBar
from collage_core.records import GRAPH_LEVEL, OP_LEVEL, Candidate, Cost, Partition
from collage_core.regions import decode, genome_key
from collage_core.relax_graph import RelaxGraph
from collage_core.result import PLACEMENT, WITHOUT_CUDA_GRAPHS, EndToEnd, OptimizedModel
from collage_core.timing import DEFAULT_BASELINE_LIMIT_S, MeasureSettings, stopped, stopped_limit
from collage_core.two_level import TwoLevelResult, TwoLevelSettings, history_text, search_two_level, seed_genomes
from collage_core.verify import Verification, compare_outputs
from collage_core.worker_client import MeasurementWorker, StageTooSlow, WorkerFailure

log = logging.getLogger("collage")
SEARCHED = "searched placement (measured slower, not returned)"
OP_LEVEL_SEARCH = "op-level"
TWO_LEVEL = "two-level"
# How an end-to-end cost was measured; part of its database key, so a change of method re-measures.
# 2: the run after a setup run is judged, not the first.
END_TO_END_PROTOCOL = "fresh-worker-2"
# The first run of a built placement pays one-time setup (ONNX Runtime creates its sessions: GPT-2
# at batch 8 took 5.5 s in its first run, 1.5 s in later ones), so it may take this many seconds
# longer than a run limit allows.
SETUP_GRACE_S = 30.0
# A genome whose run is this much slower than the best so far is not measured further.
CUTOFF_FACTOR = 1.5
# Time to build a placement, on top of measuring it.
BUILD_TIMEOUT_S = 1800.0
# TVM's own build of the whole model, no partitions: what a user gets from TVM without Collage.
UNPARTITIONED = "unpartitioned relax.build"
# Part of a baseline's end-to-end database key: baselines are timed in full, never cut off.
BASELINE_PROTOCOL = "baseline-2"
# Part of the key under which a run's end (build, verification, baselines, contest) is kept beside its library.
FINISHED_PROTOCOL = "finished-1"


def optimize(
    model: Any,
    *,
    target: Any = None,
    backends: Optional[Sequence[str]] = None,
    example_inputs: Optional[Sequence[Any]] = None,
    placement: Optional[os.PathLike] = None,
    search: Optional[str] = None,
    two_level: TwoLevelSettings = TwoLevelSettings(),
    cost_db: Optional[os.PathLike] = None,
    output_dir: Optional[os.PathLike] = None,
    settings: MeasureSettings = MeasureSettings(),
    compare_backends: bool = True,
    baseline_limit_s: Optional[float] = DEFAULT_BASELINE_LIMIT_S,
    calibration_rounds: int = DEFAULT_ROUNDS,
    verify: bool = True,
    show_progress: bool = True,
) -> OptimizedModel:
    """Place ``model`` on the fastest mix of ``backends`` (default: every available one) for ``target``.

    ``model`` is an ONNX path or ModelProto, a ``torch.nn.Module`` with ``example_inputs``, or a
    Relax IRModule. ``search`` is ``"op-level"`` or ``"two-level"`` (the default when a
    graph-level backend is selected). With ``placement`` (a placement file) nothing is measured:
    the file's placement is rebuilt. Measured costs are kept in ``cost_db`` (default: the user
    cache); with ``output_dir`` the best placement so far is saved there as the search goes.
    ``calibration_rounds`` re-searches of the op-level placement with per-partition charges
    measured end to end are tried (0: none; see :mod:`collage_core.calibration`). With
    ``compare_backends`` each backend alone and TVM's unpartitioned build are measured too; one
    whose single run takes longer than ``baseline_limit_s`` is stopped and reported as such
    (None: no limit). With ``output_dir`` too, each baseline's placement is saved there (see
    :func:`baseline_file`).
    """
    say = _Narrator(show_progress)
    clock = PhaseClock()
    imported = load_model(model, example_inputs)
    target = tvm_compat.make_target(target)
    pm = get_plugin_manager()
    infos = discover_backends(pm)
    for failure in pm.failures:
        log.warning("plugin %s: %s", failure.name, failure.reason)
    chosen = [info for info in select_backends(infos, backends) if serves(info, target)]
    if not chosen:
        raise CollageError(f"none of the selected backends runs on target {target.kind.name}")
    search = search or (TWO_LEVEL if any(i.backend.kind == GRAPH_LEVEL for i in chosen) else OP_LEVEL_SEARCH)
    if search not in (OP_LEVEL_SEARCH, TWO_LEVEL):
        raise CollageError(f"unknown search {search!r} (choose {OP_LEVEL_SEARCH} or {TWO_LEVEL})")
    graph = RelaxGraph.from_function(imported.mod["main"], imported.mod)
    say(f"{imported.name}: {len(graph.graph)} operators; backends: {', '.join(i.name for i in chosen)}; target {target}")
    workdir = Path(output_dir) if output_dir else Path(tempfile.mkdtemp(prefix="collage-"))
    workdir.mkdir(parents=True, exist_ok=True)
    job = _Job(imported, graph, target, pm, chosen, settings, workdir, say, show_progress)

    measurement, candidates, search_s, op_level_parts, two_level_result = None, [], 0.0, None, None
    if placement is not None:
        chosen_placement = job.replayed(placement)
        parts = list(chosen_placement.partitions)
        clock.lap("import and placement file")
    else:
        candidates = _all_candidates(pm, graph, chosen, target)
        with CostDatabase.open(Path(cost_db) if cost_db else default_cost_db_path()) as db:
            say(f"{len(candidates)} candidates, {len({c.key for c in candidates})} distinct; cost database {db.path}")
            clock.lap("import and candidates")
            measurement = job.measure(candidates, db)
            clock.lap("measuring candidates")
            started = time.perf_counter()
            parts = op_level_parts = job.op_level_search(candidates, measurement.costs)
            search_s = time.perf_counter() - started
            parts = op_level_parts = job.calibrated_op_level(parts, candidates, measurement.costs, db, calibration_rounds)
            if search == TWO_LEVEL:
                two_level_result = job.two_level_search(op_level_parts, candidates, db, two_level)
                parts = list(two_level_result.parts)
                search_s += two_level_result.seconds
            clock.lap("search and calibration")
        chosen_placement = job.placement(parts, search, candidates, measurement.costs)

    library = workdir / f"{imported.name}.so"
    finish = None
    if output_dir and placement is None:
        finish = finish_key(
            job._end_to_end_key(parts, FINISHED_PROTOCOL),
            {"compare_backends": compare_backends, "baseline_limit_s": baseline_limit_s, "verify": verify,
             "reference": imported.reference_name, "settings": attrs.evolve(settings, build_workers=0).to_json()},
            job.plugin_modules,
        )
        previous = load_finished(workdir, library, finish)
        if previous is not None:
            say(f"the run before in {workdir} ended from this same searched placement (same model, target, backends, "
                f"settings and code): its library, verification and end-to-end measurements are reused")
            clock.lap("reusing the run before")
            optimized = OptimizedModel(
                imported, previous.placement, library, target, previous.end_to_end, previous.verification, measurement,
                len(candidates), search_s, partition_module(graph, list(previous.placement.partitions)), two_level_result,
                phases_s=clock.phases_s,
            )
            optimized.save(workdir)
            return optimized

    def verified(built: _Built) -> Optional[Verification]:
        if not verify or imported.reference is None:
            return None
        verification = compare_outputs(built.outputs, imported.reference(job.inputs), imported.reference_name)
        say(verification.describe())
        return verification

    say("building the placement and measuring it end to end")
    built = job.build(parts, library)
    verification = verified(built)
    clock.lap("building and verifying")
    results = [EndToEnd(PLACEMENT, built.cost, operators_by_backend(parts))]
    if compare_backends:
        # A replayed placement measures its baselines afresh: replaying reads no cost database.
        with opened_again(cost_db, placement) as db:
            baselines = job.baselines(parts, built.cost, candidates, measurement, op_level_parts, two_level_result,
                                      baseline_limit_s, db)
        results += [entry for entry, _ in baselines]
        clock.lap("baselines")
        if output_dir:
            for entry, baseline_parts in baselines:
                if baseline_parts is not None:
                    job.placement(baseline_parts, f"baseline: {entry.name}").save(baseline_file(output_dir, entry.name))
        faster, rivals = None, closest_rivals(baselines, parts, built.cost, settings)
        contest = job.contest(library, rivals) if rivals else None
        clock.lap("contest in turns")
        if contest is not None:
            results.append(EndToEnd(f"{PLACEMENT}, {IN_TURNS}", contest.turns[PLACEMENT], operators_by_backend(parts)))
            results += [EndToEnd(f"{entry.name}, {IN_TURNS}", contest.turns[entry.name], operators_by_backend(rival_parts))
                        for entry, rival_parts in rivals]
            if contest.winner is not None:
                faster, built = rivals[contest.winner], contest.winner_build
        else:
            faster = faster_baseline(baselines, built.cost)
            if faster is not None:
                built = job.build(faster[1], library)
        if faster is not None:
            # What ran faster beside it is the result, with the cost its own build measured.
            entry, parts = faster
            say(f"{entry.name} measured faster than the searched placement: it is the result")
            chosen_placement = job.placement(parts, search, candidates, measurement.costs if measurement else None)
            verification = verified(built)
            clock.lap("building and verifying")
            results[0] = attrs.evolve(results[0], name=SEARCHED)
            results.insert(0, EndToEnd(PLACEMENT, built.cost, operators_by_backend(parts)))
        with opened_again(cost_db, placement) as db:
            plain = job.without_cuda_graphs(parts, baseline_limit_s, db)
        if plain is not None:
            results.insert(1, plain)
            clock.lap("without CUDA graphs")
    optimized = OptimizedModel(
        imported, chosen_placement, library, target, results, verification, measurement, len(candidates), search_s,
        built.partitioned, two_level_result, phases_s=clock.phases_s,
    )
    if output_dir:
        optimized.save(output_dir)
        if finish is not None:
            save_finished(workdir, library, FinishedBuild(finish, chosen_placement, results, verification))
    return optimized


def opened_again(cost_db, placement):
    """The cost database for the baselines; none when replaying a placement file (it reads no database)."""
    if placement is not None:
        return contextlib.nullcontext()
    return CostDatabase.open(Path(cost_db) if cost_db else default_cost_db_path())


@attrs.define
class _Job:
    """What one optimization carries from step to step."""

    imported: ImportedModel
    graph: RelaxGraph
    target: Any
    pm: Any
    chosen: list
    settings: MeasureSettings
    workdir: Path
    say: Any
    show_progress: bool
    inputs: list = attrs.field(init=False)
    # The key under which the zygote holds this job's model (weights included: unique to the job).
    held_key: str = attrs.field(init=False, factory=lambda: uuid.uuid4().hex)
    plugin_modules: list = attrs.field(init=False)
    disabled: list = attrs.field(init=False)
    # Placements measured end to end in full during this job (not cut off), by signature.
    measured_end_to_end: dict = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self):
        self.inputs = self.imported.random_inputs()
        self.plugin_modules = self.pm.module_plugin_names()
        self.disabled = sorted(disabled_plugin_names())

    @property
    def backends(self) -> dict:
        return {info.name: info.backend for info in self.chosen}

    def replayed(self, path) -> Placement:
        placement = load_placement(path)
        placement.check_fits(self.graph.graph, str(path))
        missing = sorted({p.backend for p in placement.partitions} - set(self.backends))
        if missing:
            raise CollageError(f"{path}: placed on backend(s) not available here: {', '.join(missing)}")
        self.say(f"replaying {path}: {len(placement.partitions)} partitions, nothing measured")
        here = tvm_compat.device_name(self.target)
        if placement.device != here:
            log.warning("%s was measured on %s and is replayed on %s: its costs and choices may not hold here",
                        path, placement.device, here)
        return attrs.evolve(placement, inputs_of=[sorted(preds) for preds in self.graph.graph.preds],
                            ran_on=here if placement.device != here else "")

    def op_level_candidates(self, candidates) -> list[Candidate]:
        """Candidates whose costs add up; graph-level ones are judged end to end by the two-level search."""
        return [c for c in candidates if self.backends[c.backend].kind == OP_LEVEL]

    def measure(self, candidates, db) -> MeasurementReport:
        op_level = self.op_level_candidates(candidates)
        report = measure_candidates(
            self.graph, op_level, self.backends, self.target, db, self.settings, self.plugin_modules, self.disabled,
            self.show_progress,
        )
        self.say(
            f"measured {report.measured} in {report.seconds:.1f} s, {report.from_database} from the database, "
            f"{report.invalid} invalid"
        )
        return report

    def op_level_search(self, candidates, costs) -> list[Partition]:
        op_level = self.op_level_candidates(candidates)
        if not op_level:
            raise CollageError("no op-level backend selected: one (such as tvm) must cover what graph-level backends do not")
        started = time.perf_counter()
        parts = searched_parts(self.graph, op_level, costs)
        self.say(f"op-level search: {len(parts)} partitions in {time.perf_counter() - started:.2f} s")
        return parts

    def two_level_search(self, op_level_parts, candidates, db, settings: TwoLevelSettings) -> TwoLevelResult:
        groups = op_groups(op_level_parts, candidates, self.backends)
        movable = sum(1 for g in groups if g.choices)
        self.say(f"two-level search: {len(groups)} op groups, {movable} of them can go to a graph-level backend")
        # Each placement is measured in a fresh worker: ONNX Runtime in a process where TVM kernels
        # (or other sessions) ran before measured 124 ms instead of 46 ms on ResNet-50.
        with ProgressBar(settings.generations, "two-level search", enabled=self.show_progress) as bar:
            evaluate = self.end_to_end_evaluator(db)

            def on_best(parts, cost):
                self.placement(parts, TWO_LEVEL).save(self.workdir / "placement.json")

            def on_generation(record):
                line = (f"generation {record.generation}: best {record.best_s * 1e3:.3f} ms "
                        f"({record.gains_text() if record.generation else 'from the seeds'}), "
                        f"budget left {max(record.budget_left_s, 0):.0f} s")
                if record.generation:
                    bar.advance(line)

            result = search_two_level(self.graph.graph, groups, evaluate, settings, on_generation, on_best,
                                      spent=lambda: evaluate.spent_s)
        result = attrs.evolve(result, from_database=evaluate.from_database)
        self.say(
            f"two-level search: best {result.latency.seconds * 1e3:.3f} ms after {result.generations} generations, "
            f"{result.measured} placements scored end to end ({result.from_database} from the cost database, "
            f"{result.evaluated} evaluated) in {result.seconds:.1f} s"
        )
        if result.history:
            self.say(f"two-level search, operators by backend: {history_text(result.history)}")
        return result

    def end_to_end_evaluator(self, db, cut_off: bool = True) -> "_EndToEndEvaluator":
        """A function measuring a placement end to end in a fresh worker, once per placement (kept in ``db``).

        With ``cut_off``, a placement whose first run is CUTOFF_FACTOR times slower than the best so
        far is not timed further. Its ``spent_s`` is what the measurements took, counting those read
        from ``db`` at what they took when measured.
        """
        return _EndToEndEvaluator(self, db, cut_off)

    def calibrated_op_level(self, parts, candidates, costs, db, rounds: int) -> list[Partition]:
        """The op-level placement re-searched with per-partition charges measured end to end (see calibration)."""
        if rounds <= 0:
            return parts
        self.say("calibrating the op-level search end to end")
        op_level = self.op_level_candidates(candidates)
        alternatives = [
            baseline
            for info in self.chosen
            if info.backend.kind == OP_LEVEL
            for baseline in [single_backend_parts(self.graph, op_level, costs, info.name, self.backends)]
            if baseline is not None
        ]
        evaluate = self.end_to_end_evaluator(db)
        result = calibrate(self.graph.graph, op_level, costs, parts, evaluate, rounds, alternatives)
        for number, step in enumerate(result.rounds):
            self.say(
                f"  round {number}: {step.partitions} partitions, candidates sum to {step.summed_s * 1e3:.3f} ms, "
                f"end to end {_describe_cost(step.latency)}: {step.charge_per_partition_s * 1e6:.1f} us per partition unexplained"
            )
        if result.alternative:
            self.say(f"'{result.alternative}' measured fastest end to end ({_describe_cost(result.latency)}): it is the placement")
        elif signature(result.parts) != signature(parts):
            self.say(f"calibrated op-level placement: {len(result.parts)} partitions, {_describe_cost(result.latency)}")
        return list(result.parts)

    def _end_to_end_key(self, parts, protocol: str = END_TO_END_PROTOCOL, cuda_graphs: Optional[bool] = None) -> str:
        """The database key of ``parts`` measured by ``protocol``; None for parts: TVM's unpartitioned build.
        On a CUDA target, a build replaying CUDA graphs (``cuda_graphs``, default the settings') has keys of its own."""
        versions = ",".join(f"{name}={b.version}" for name, b in sorted(self.backends.items()))
        placed = UNPARTITIONED if parts is None else genome_key(parts)
        fields = [protocol, self.imported.fingerprint, tvm_compat.target_to_json(self.target), versions, placed]
        if tvm_compat.is_cuda(self.target):
            fields.append(tvm_compat.device_name(self.target))
        if self._replays_cuda_graphs(cuda_graphs):
            fields.append("cuda-graphs")
        text = "|".join(fields)
        return hashlib.sha256(text.encode()).hexdigest()

    def placement(self, parts, search: str, candidates=(), costs=None) -> Placement:
        """The placement file's record; with ``candidates`` and their ``costs``, it can be explained later."""
        costs = costs or {}
        return Placement(
            model_name=self.imported.name,
            model_fingerprint=self.imported.fingerprint,
            operators=self.graph.graph.ops,
            target=tvm_compat.target_to_dict(self.target),
            device=tvm_compat.device_name(self.target),
            backends={i.name: {"version": i.backend.version, "kind": i.backend.kind} for i in self.chosen},
            search=search,
            partitions=parts,
            inputs_of=[sorted(preds) for preds in self.graph.graph.preds],
            considered=[Partition.from_candidate(c, costs.get(c.key, Cost.unknown())) for c in candidates],
        )

    def _replays_cuda_graphs(self, cuda_graphs: Optional[bool] = None) -> bool:
        wanted = self.settings.cuda_graphs if cuda_graphs is None else cuda_graphs
        return wanted and tvm_compat.is_cuda(self.target)

    def run_built(self, parts, library: Optional[Path], cutoff_s: Optional[float] = None,
                  run_limit_s: Optional[float] = None, mod=None, cuda_graphs: Optional[bool] = None):
        """Build ``parts`` (None: TVM's unpartitioned build of the model; ``mod``: their module when
        the caller has it) in a fresh worker, run it on the job's inputs and time it; returns
        (outputs, cost).

        Workers forked from a zygote that holds the model (see :func:`zygote.hold_model`) are sent
        the partitions alone and build the placement from their own copy; others are sent the
        placed module. With ``run_limit_s``, a run taking longer stops the worker:
        :class:`StageTooSlow`. The first run, which pays one-time setup, has SETUP_GRACE_S more
        (see :func:`_run_limits`). ``cuda_graphs`` overrides the settings' choice for this build.
        """
        module_path, inputs_path, outputs_path = (self.workdir / name for name in ("placed.json", "inputs.npz", "outputs.npz"))
        np.savez(inputs_path, *self.inputs)
        request = {
            "op": "run_placement",
            "target": tvm_compat.target_to_json(self.target),
            "inputs": str(inputs_path),
            "outputs": str(outputs_path),
            "settings": attrs.evolve(self.settings, cutoff_s=cutoff_s,
                                     cuda_graphs=self.settings.cuda_graphs if cuda_graphs is None else cuda_graphs).to_json(),
            "library": str(library) if library else None,
        }
        held = parts is not None and zygote.hold_model(self.plugin_modules, self.disabled, self.held_key, self._write_model)
        (self.workdir / "model.json").unlink(missing_ok=True)
        response = None
        if held:
            parts_json = [{"backend": p.backend, "pattern": p.pattern, "nodes": list(p.nodes)} for p in parts]
            try:
                response = self._run_in_worker({**request, "held": self.held_key, "parts": parts_json}, run_limit_s)
            except _HeldElsewhere:
                pass  # sent whole below
        try:
            if response is None:
                if mod is None:
                    mod = self.imported.mod if parts is None else partition_module(self.graph, parts)
                module_path.write_text(tvm_compat.save_ir_json(mod))
                response = self._run_in_worker({**request, "module": str(module_path)}, run_limit_s)
        finally:
            module_path.unlink(missing_ok=True)
        with np.load(outputs_path, allow_pickle=False) as saved:
            outputs = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        for path in (inputs_path, outputs_path):
            path.unlink(missing_ok=True)
        return outputs, Cost.from_json(response["cost"])

    def _run_in_worker(self, request: dict, run_limit_s: Optional[float]) -> dict:
        try:
            with MeasurementWorker(self.plugin_modules, self.disabled) as worker:
                return worker.request(request, self.settings.timeout_s + BUILD_TIMEOUT_S,
                                      stage_limits=None if run_limit_s is None else _run_limits(run_limit_s))
        except StageTooSlow:
            raise
        except WorkerFailure as failure:
            if "held" in request and "does not hold model" in str(failure):
                raise _HeldElsewhere from None  # a zygote started since (the environment changed): send the module
            raise CollageError(f"building or running the placement failed: {failure}") from None

    def _write_model(self) -> Path:
        """The model saved as IR JSON for a zygote to hold (it reads it at once; see :meth:`run_built`)."""
        path = self.workdir / "model.json"
        path.write_text(tvm_compat.save_ir_json(self.imported.mod))
        return path

    def baselines(self, parts, placement_cost, candidates, measurement, op_level_parts, two_level_result,
                  limit_s: Optional[float] = None, db=None) -> list[tuple[EndToEnd, Optional[list[Partition]]]]:
        """TVM's unpartitioned build, the op-level placement, and each backend alone (or with a fallback),
        each with its partitions (None for the unpartitioned build).

        A baseline whose one run takes longer than ``limit_s`` is stopped; its cost is invalid
        and says so. With ``db``, baselines measured before are read from it, not measured again.
        """
        built: list[tuple[str, list]] = []
        if two_level_result is not None:
            built.append(("op-level placement", op_level_parts))
            groups = op_groups(op_level_parts, candidates, self.backends)
            for genome in seed_genomes(groups)[1:]:
                backend = next(g.choices[v - 1] for g, v in zip(groups, genome) if v)
                covers = all(v for g, v in zip(groups, genome))
                name = f"{backend} alone" if covers else f"{backend} + op-level placement for the rest"
                built.append((name, decode(self.graph.graph, groups, genome)))
        if measurement is not None:
            for info in self.chosen:
                if info.backend.kind != OP_LEVEL:
                    continue
                baseline = single_backend_parts(self.graph, candidates, measurement.costs, info.name, self.backends)
                if baseline is not None:
                    built.append(baseline)
        # TVM's unpartitioned build runs the kernels of TVM alone without partition boundaries: it
        # cannot win where TVM alone cannot.
        tvm_alone = next((p for name, p in built if name == "tvm alone"), None)
        reference = op_level_parts or parts
        unpartitioned = predicted_cost(tvm_alone, reference, "TVM alone's") if tvm_alone is not None else None
        if unpartitioned is not None:
            self.say(f"{UNPARTITIONED}: {unpartitioned.reason}")
        results = [(EndToEnd(UNPARTITIONED, unpartitioned or self._baseline_cost(UNPARTITIONED, None, limit_s, db),
                             {"relax.build": len(self.graph.graph)}), None)]
        measured = {**self.measured_end_to_end, signature(parts): placement_cost}
        for name, baseline_parts in built:
            baseline_signature = signature(baseline_parts)
            if baseline_signature not in measured:
                cannot_win = predicted_cost(baseline_parts, reference)
                if cannot_win is not None:
                    self.say(f"{name}: {cannot_win.reason}")
                measured[baseline_signature] = cannot_win or self._baseline_cost(name, baseline_parts, limit_s, db)
            results.append((EndToEnd(name, measured[baseline_signature], operators_by_backend(baseline_parts)),
                            baseline_parts))
        return results

    def build(self, parts, library: Path) -> "_Built":
        """``parts`` built into ``library`` (with its runtime file beside it), run on the job's inputs and timed."""
        partitioned = partition_module(self.graph, parts)
        outputs, cost = self.run_built(parts, library, mod=partitioned)
        write_runtime_file(library, backend_needs(self.backends.values(), {p.backend for p in parts}))
        return _Built(partitioned, outputs, cost)

    def contest(self, library: Path, rivals) -> Optional["_Contest"]:
        """The placement's ``library`` and a build of each rival (``(EndToEnd, parts)`` pairs) timed in
        turns (see :mod:`collage_core.in_turns`); None if that failed. When the fastest rival beat the
        placement by TURNS_MARGIN, its build replaces ``library`` and is the contest's winner."""
        names = ", ".join(entry.name for entry, _ in rivals)
        self.say(f"timing the placement and {names} in turns")
        rivals_dir = self.workdir / "rivals"
        try:
            builds = []
            for index, (_, rival_parts) in enumerate(rivals):
                (rivals_dir / str(index)).mkdir(parents=True, exist_ok=True)
                builds.append(self.build(rival_parts, rivals_dir / str(index) / library.name))
            inputs = rivals_dir / "inputs.npz"
            np.savez(inputs, *self.inputs)
            libraries = {PLACEMENT: library}
            libraries.update((entry.name, rivals_dir / str(i) / library.name) for i, (entry, _) in enumerate(rivals))
            turns = time_in_turns(libraries, inputs, tvm_compat.target_to_json(self.target), self.plugin_modules,
                                  self.disabled)
            self.say("  in turns: " + ", ".join(f"{name} {_describe_cost(cost)}" for name, cost in turns.items()))
            fastest = min(range(len(rivals)), key=lambda i: turns[rivals[i][0].name].seconds)
            if turns[rivals[fastest][0].name].seconds >= turns[PLACEMENT].seconds * (1 - TURNS_MARGIN):
                return _Contest(turns)
            won = rivals_dir / str(fastest) / library.name
            os.replace(runtime_file(won), runtime_file(library))
            os.replace(won, library)
            return _Contest(turns, fastest, builds[fastest])
        except (CollageError, WorkerFailure) as error:
            self.say(f"  could not time them in turns: {error}")
            return None
        finally:
            shutil.rmtree(rivals_dir, ignore_errors=True)

    def without_cuda_graphs(self, parts, limit_s: Optional[float], db) -> Optional[EndToEnd]:
        """On a CUDA target whose placements replay CUDA graphs: ``parts`` built to launch each kernel
        on its own and measured, so that the report shows what the graphs gain; None elsewhere."""
        if not self._replays_cuda_graphs():
            return None
        cost = self._baseline_cost(WITHOUT_CUDA_GRAPHS, parts, limit_s, db, cuda_graphs=False)
        return EndToEnd(WITHOUT_CUDA_GRAPHS, cost, operators_by_backend(parts))

    def _baseline_cost(self, name: str, parts, limit_s: Optional[float], db, cuda_graphs: Optional[bool] = None) -> Cost:
        """``parts`` (None: TVM's unpartitioned build) measured in full, or as measured before in ``db``.

        A stopped measurement is reused only under a limit no longer than the one it exceeded; one
        measured before and slower than ``limit_s`` is stopped without building it again.
        """
        key = self._end_to_end_key(parts, BASELINE_PROTOCOL, cuda_graphs)
        known = None if db is None else db.get_end_to_end(key)
        if known is not None and limit_s is not None and known.seconds > limit_s and known.is_measured:
            self.say(f"{name}: stopped, it measured {_describe_cost(known)} before (from the cost database)")
            return stopped(limit_s)
        if known is not None:
            exceeded = stopped_limit(known)
            if exceeded is None or (limit_s is not None and limit_s <= exceeded):
                self.say(f"{name}: {_describe_cost(known)} (from the cost database)")
                return known
        self.say(f"building and measuring {name}")
        started = time.perf_counter()
        try:
            cost = self.run_built(parts, None, run_limit_s=limit_s, cuda_graphs=cuda_graphs)[1]
        except StageTooSlow as slow:
            self.say(f"  stopped: one run takes longer than {slow.limit_s:g} s")
            cost = stopped(slow.limit_s)
        except CollageError as error:
            return Cost.invalid(str(error))  # not kept: a crash may be the machine's, not the build's
        if db is not None:
            db.put_end_to_end(key, cost, effort_s=time.perf_counter() - started)
        return cost


class _HeldElsewhere(Exception):
    """The worker came from a zygote that does not hold the model: the placed module is sent."""


@attrs.frozen
class _Built:
    """A placement built into a library: its partitioned module, its outputs on the job's inputs, its cost."""

    partitioned: Any
    outputs: list
    cost: Cost


@attrs.frozen
class _Contest:
    """Costs timed in turns by name; the index of the rival that beat the placement, and its build."""

    turns: dict
    winner: Optional[int] = None
    winner_build: Optional[_Built] = None


class _EndToEndEvaluator:
    """Measures a placement end to end in a fresh worker, once per placement (kept in the cost database).

    ``spent_s`` adds up what each measurement took, those read from the database at what they
    took when measured: a search budgeted by it stops at the same point on a warm database as it
    did when it measured, and so returns the same placement.
    """

    def __init__(self, job: "_Job", db, cut_off: bool):
        self.job, self.db, self.cut_off = job, db, cut_off
        self.best_s = math.inf
        self.spent_s = 0.0
        self.from_database = 0

    def __call__(self, parts) -> Cost:
        job = self.job
        key = job._end_to_end_key(parts)
        known = self.db.get_end_to_end_entry(key)
        if known is not None:
            cost, effort_s = known
            self.from_database += 1
            self.best_s = min(self.best_s, cost.seconds)
            self.spent_s += effort_s
            if cost.repeats > 1:
                job.measured_end_to_end[signature(parts)] = cost
            return cost
        cutoff = CUTOFF_FACTOR * self.best_s if self.cut_off and math.isfinite(self.best_s) else None
        started = time.perf_counter()
        try:
            _, cost = job.run_built(parts, None, cutoff_s=cutoff)
            self.best_s = min(self.best_s, cost.seconds)
            if cost.repeats > 1:
                job.measured_end_to_end[signature(parts)] = cost
            job.say(f"  placement of {len(parts)} partitions: {_describe_cost(cost)}, best {self.best_s * 1e3:.3f} ms")
        except CollageError as error:
            cost = Cost.invalid(str(error))
        effort_s = time.perf_counter() - started
        self.spent_s += effort_s
        self.db.put_end_to_end(key, cost, effort_s=effort_s)
        return cost


class PhaseClock:
    """Seconds spent in each phase of a run, in order (a phase lapped twice adds up)."""

    def __init__(self):
        self.phases_s: dict[str, float] = {}
        self.last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases_s[phase] = self.phases_s.get(phase, 0.0) + now - self.last
        self.last = now


class _Narrator:
    """Says what the job is doing on stderr, each line after the minutes and seconds since it started."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.started = time.perf_counter()

    def __call__(self, message: str) -> None:
        if self.enabled:
            minutes, seconds = divmod(int(time.perf_counter() - self.started), 60)
            print(f"[{minutes:02d}:{seconds:02d}] {message}", file=sys.stderr, flush=True)


def _all_candidates(pm, graph: RelaxGraph, chosen: Sequence[BackendInfo], target) -> list[Candidate]:
    patterns = [pattern for info in chosen for pattern in contribute_patterns(pm, info.backend, target)]
    return enumerate_candidates(graph, patterns)


def _run_limits(run_limit_s: float) -> dict:
    """The worker's stage limits for runs judged by ``run_limit_s``: the first run after the build
    pays one-time setup, so it may take SETUP_GRACE_S longer; the run after it gets ``run_limit_s``."""
    return {"built": run_limit_s + SETUP_GRACE_S, "set up": run_limit_s}


def _describe_cost(cost: Cost) -> str:
    if not cost.is_measured:
        return f"invalid ({cost.reason})"
    cut = " (cut off after one run)" if cost.repeats == 1 else ""
    return f"{cost.median_s * 1e3:.3f} ms{cut}"


