"""One optimization's state and what every stage does with it: run a placement in a fresh worker,
key its end-to-end cost, measure it once per placement, describe the placement in a file."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import attrs
import numpy as np

from collage_core import tvm_compat
from collage_core.backends import contribute_patterns
from collage_core.build.deploy import runtime_file
from collage_core.build.partition import partition_module
from collage_core.candidates.enumeration import enumerate_candidates
from collage_core.errors import CollageError, reraise_interrupt
from collage_core.measure import zygote
from collage_core.measure.arrays_file import load_arrays
from collage_core.measure.cost_db import Claim, CostDatabaseError
from collage_core.measure.measurement import CLAIM_POLL_S, threads_key_part
from collage_core.measure.progress import ProgressBar
from collage_core.measure.timing import MeasureSettings, stopped
from collage_core.measure.worker import LOST
from collage_core.measure.worker_client import START_TIMEOUT_S, MeasurementWorker, StageTooSlow, WorkerFailure
from collage_core.model import original_model
from collage_core.model.model_import import ImportedModel
from collage_core.model.relax_graph import RelaxGraph
from collage_core.model.widening import touches_sixteen_bit
from collage_core.outputs import placement_file
from collage_core.outputs.placement_file import Placement, load_placement
from collage_core.plugins import disabled_plugin_names
from collage_core.records import OP_LEVEL, Backend, Candidate, Cost, Partition
from collage_core.search.calibration import signature
from collage_core.search.regions import genome_key, region_pattern, whole_model_pattern

log = logging.getLogger("collage")
# How an end-to-end cost was measured; part of its database key, so a change of method re-measures.
# 2: the run after a setup run is judged, not the first. 3: a run under worker.REJUDGE_BELOW_S is
# judged by TVM's timer, not by its call from Python.
END_TO_END_PROTOCOL = "fresh-worker-3"
# The first run of a built placement pays one-time setup (ONNX Runtime creates its sessions: GPT-2
# at batch 8 took 5.5 s in its first run, 1.5 s in later ones), so it may take this many seconds
# longer than a run limit allows.
SETUP_GRACE_S = 30.0
# A genome whose run is this much slower than the best so far is not measured further.
CUTOFF_FACTOR = 1.5
# The least run limit of a placement measured against a cutoff: the message saying a run ended
# takes time of its own to arrive, and a limit of milliseconds would stop fast GPU placements.
RUN_LIMIT_FLOOR_S = 1.0
# Time to build a placement, on top of measuring it.
BUILD_TIMEOUT_S = 1800.0
# TVM's own build of the whole model, no partitions: what a user gets from TVM without Collage.
UNPARTITIONED = "unpartitioned relax.build"
# How many servers a placement measured remotely is tried on when the one running it stops answering.
REMOTE_ATTEMPTS = 3
# Part of a baseline's end-to-end database key: baselines are timed in full, never cut off.
BASELINE_PROTOCOL = "baseline-2"
# Part of the key under which a run's end (build, verification, baselines, contest) is kept beside its library.
FINISHED_PROTOCOL = "finished-1"


def made_for_another_version(placement: Placement, imported: ImportedModel) -> str:
    """What a replay says of a placement made for another version of the model it builds (another fingerprint: other
    shapes or attributes, or another file), on stderr and in why it was chosen; empty when it was made for this one."""
    if placement.model_fingerprint == imported.fingerprint:
        return ""
    return (
        f"made for another version of this model (its fingerprint is {placement.model_fingerprint}, this model's "
        f"{imported.fingerprint}: other shapes or attributes, or another file): its partitions' costs are that model's, "
        "not measured here"
    )


@attrs.define
class Job:
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
    # Where the files sent to and from workers go: the run's own folder (see output_folder.held), removed
    # when it ends; default ``workdir``.
    scratch: Path = attrs.field(default=attrs.Factory(lambda self: self.workdir, takes_self=True))
    inputs: list = attrs.field(init=False)
    # The key under which the zygote holds this job's model (weights included: unique to the job).
    held_key: str = attrs.field(init=False, factory=lambda: uuid.uuid4().hex)
    plugin_modules: list = attrs.field(init=False)
    disabled: list = attrs.field(init=False)
    # Placements measured end to end in full during this job (not cut off), by signature.
    measured_end_to_end: dict = attrs.field(init=False, factory=dict)
    # Each engine's own session over the original model file, lowered once (see collage_core.model.original_model).
    original_modules: dict = attrs.field(init=False, factory=dict, repr=False)
    # The servers placements are run and timed on (collage_core.measure.remote.RemoteServers), or None: here.
    remote: Any = None

    def __attrs_post_init__(self):
        self.inputs = self.imported.random_inputs()
        self.plugin_modules = self.pm.module_plugin_names()
        self.disabled = sorted(disabled_plugin_names())

    @property
    def backends(self) -> dict:
        return {info.name: info.backend for info in self.chosen}

    def replayed(self, path) -> Placement:
        placement = load_placement(path)
        placement_file.check_same_file(placement, self.imported, str(path))
        placement.check_fits(self.graph.graph, str(path))
        missing = sorted({p.backend for p in placement.partitions} - set(self.backends))
        if missing:
            raise CollageError(
                f"{path}: placed on backend(s) not among this run's ({', '.join(sorted(self.backends))}): {', '.join(missing)}; "
                "add them to --backends (`collage backends` says whether they run here)"
            )
        self._check_matches(placement, path)
        self.say(f"replaying {path}: {len(placement.partitions)} partitions, nothing measured")
        other_version = made_for_another_version(placement, self.imported)
        if other_version:
            log.warning("%s was %s", path, other_version)
        made_for, running = str(placement.target.get("kind", "")), str(self.target.kind.name)
        if made_for != running:
            log.warning(
                "%s was made for a %s target and is replayed on a %s target: its costs and choices are not this target's",
                path,
                made_for or "unnamed",
                running,
            )
        here = tvm_compat.device_name(self.target)
        if placement.device != here:
            log.warning(
                "%s was measured on %s and is replayed on %s: its costs and choices may not hold here", path, placement.device, here
            )
        return attrs.evolve(
            placement, inputs_of=[sorted(preds) for preds in self.graph.graph.preds], ran_on=here if placement.device != here else ""
        )

    def _check_matches(self, placement: Placement, path) -> None:
        """Each partition placed by one of its backend's patterns must be a match of that pattern over these operators
        (a file edited by hand, or made for another model of the same shapes, may say otherwise); partitions the
        search makes of several matches (regions, whole models) are left to the build."""
        by_backend = {info.name: info for info in self.chosen}
        patterns = {
            (backend, pattern.name): pattern
            for backend in sorted({part.backend for part in placement.partitions})
            for pattern in contribute_patterns(self.pm, by_backend[backend].backend, self.target, self.imported.precision)
        }
        refusals: list = []
        matches: dict = {}  # by pattern: its matches over this model, found once however many partitions it placed
        for index, part in enumerate(placement.partitions):
            if part.pattern == whole_model_pattern(part.backend):
                self._check_whole_model(part, index, by_backend[part.backend].backend, path)
            pattern = patterns.get((part.backend, part.pattern))
            composite = (whole_model_pattern(part.backend), region_pattern(part.backend), original_model.pattern(part.backend))
            if pattern is None and by_backend[part.backend].backend.kind == OP_LEVEL and part.pattern not in composite:
                raise CollageError(
                    f"{path}: partition {index} names pattern {part.pattern}, which is not one of backend {part.backend}'s "
                    "patterns here; the file was edited, or made with another version of the backend"
                )
            if pattern is None:
                continue
            if (part.backend, part.pattern) not in matches:
                found = enumerate_candidates(self.graph, [pattern], refusals)
                matches[(part.backend, part.pattern)] = {candidate.nodes for candidate in found}
            if frozenset(part.nodes) in matches[(part.backend, part.pattern)]:
                continue
            why = next((f": {r.reason}" for r in refusals if r.pattern == part.pattern and r.nodes == frozenset(part.nodes)), "")
            shown = ", ".join(str(node) for node in part.nodes[:6]) + (", ..." if len(part.nodes) > 6 else "")
            raise CollageError(
                f"{path}: partition {index} ({part.backend}, pattern {part.pattern}, operators {shown}) is not a match of "
                f"that pattern in this model{why}; the file was edited, or made for another model"
            )

    def _check_whole_model(self, part, index: int, backend: Backend, path) -> None:
        """A partition named as ``backend``'s unpartitioned build: the backend must make one, of every operator."""
        if not backend.builds_whole_models:
            raise CollageError(
                f"{path}: partition {index} names pattern {part.pattern}, but backend {part.backend} does not build whole "
                "models; the file was edited, or made with another version of the backend"
            )
        if len(set(part.nodes)) != len(self.graph.graph.ops):
            raise CollageError(
                f"{path}: partition {index} ({part.pattern}) holds {len(set(part.nodes))} of this model's "
                f"{len(self.graph.graph.ops)} operators, where a whole-model build holds every one; the file was edited"
            )

    def op_level_candidates(self, candidates) -> list[Candidate]:
        """Candidates whose costs add up; graph-level ones are judged end to end by the two-level search."""
        return [c for c in candidates if self.backends[c.backend].kind == OP_LEVEL]

    def end_to_end_evaluator(self, db, cut_off: bool = True) -> "EndToEndEvaluator":
        """A function measuring a placement end to end in a fresh worker, once per placement (kept in ``db``).

        With ``cut_off``, a placement whose first run is CUTOFF_FACTOR times slower than the best so
        far is not timed further. Its ``spent_s`` is what the measurements took, counting those read
        from ``db`` at what they took when measured.
        """
        return EndToEndEvaluator(self, db, cut_off, placement_claim_lifetime_s(self.settings))

    def end_to_end_key(self, parts, protocol: str = END_TO_END_PROTOCOL, cuda_graphs: Optional[bool] = None) -> str:
        """The database key of ``parts`` measured by ``protocol``; None for parts: TVM's unpartitioned build.
        On a CUDA target, a build replaying CUDA graphs (``cuda_graphs``, default the settings') has keys of its own;
        on the CPU, thread settings other than the machine's defaults have (``threads.key_part``)."""
        versions = ",".join(f"{name}={b.version}" for name, b in sorted(self.backends.items()))
        if parts is None:
            placed = UNPARTITIONED
        elif original_model.engine_of(parts):
            placed = original_model.key_part(parts, self.backends)
        else:
            placed = genome_key(parts)
        fields = [protocol, self.imported.fingerprint, tvm_compat.target_to_json(self.target), versions, placed]
        if tvm_compat.is_cuda(self.target):
            fields.append(tvm_compat.device_name(self.target))
        fields += [part for part in [threads_key_part(self.target, self.remote is not None)] if part]
        if self.replays_cuda_graphs(cuda_graphs):
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
            precision=self.imported.precision,
            layout=self.imported.layout,
            float32_units=self.imported.float32_units,
            sixteen_bit_operators=sixteen_bit_operators(self.graph),
            partitions=parts,
            inputs_of=[sorted(preds) for preds in self.graph.graph.preds],
            considered=[Partition.from_candidate(c, costs.get(c.key, Cost.unknown())) for c in candidates],
            original_model=self._original_record(parts),
        )

    def _original_record(self, parts) -> Optional[dict]:
        engine = original_model.engine_of(parts)
        if engine is None:
            return None
        original = self.imported.original
        return {"engine": engine, "format": original.format, "sha256": original.digest}

    def own_session_module(self, backend: str):
        """The module running the original model file in ``backend``'s own session (see
        collage_core.model.original_model), lowered once per job; None when no plugin runs it."""
        if backend not in self.original_modules:
            self.original_modules[backend] = original_model.lowered_module(self.pm, self.imported, self.backends[backend], self.target)
        return self.original_modules[backend]

    def partitioned(self, parts):
        """``parts`` applied to the model: each partition a function annotated with its backend, or, for an
        engine's own session over the original model file, that session lowered."""
        engine = original_model.engine_of(parts)
        if engine is None:
            return partition_module(self.graph, parts)
        mod = self.own_session_module(engine)
        if mod is None:
            raise CollageError(f"no plugin runs the original model file of {self.imported.name} on {engine}")
        return mod

    def replays_cuda_graphs(self, cuda_graphs: Optional[bool] = None) -> bool:
        wanted = self.settings.cuda_graphs if cuda_graphs is None else cuda_graphs
        return wanted and tvm_compat.is_cuda(self.target)

    def prebuild(self, placements, workers: int, run_limit_s: Optional[float] = None, warm: Optional[bool] = None) -> list[Optional[Path]]:
        """Build each of ``placements`` (lists of partitions) into a library, ``workers`` at once, each in a fresh
        worker (the worker's ``build_placement``), for :meth:`run_built` to time with ``prebuilt`` one by one
        afterwards. On a GPU, where a run takes milliseconds and what a backend compiles at its first run
        (AOTInductor's packages) takes seconds, each worker also runs its placement once, untimed, so that the
        compiling is done at once as well; on the CPU a placement's first run can take seconds (untuned TVM
        kernels), and would be paid twice (``warm`` overrides the choice).

        Gives each placement's library, or None where building or running it failed: measured as usual, it is
        built again and the failure reported there. A run that takes longer than ``run_limit_s`` (with
        SETUP_GRACE_S more) is stopped there and its library kept: its timing stops it again, at the limit it
        is timed with. The caller removes the libraries (:func:`remove_prebuilt`)."""
        batch = uuid.uuid4().hex[:8]
        inputs_path = self.scratch / f"prebuild-{batch}-inputs.npz"
        warm = tvm_compat.is_cuda(self.target) if warm is None else warm
        if warm:
            np.savez(inputs_path, *self.inputs)
        held = self._model_held()
        requests = []
        for index, parts in enumerate(placements):
            name = f"prebuild-{batch}-{index}"
            request = {
                "op": "build_placement",
                "target": tvm_compat.target_to_json(self.target),
                **({"inputs": str(inputs_path), "outputs": str(self.scratch / f"{name}.npz")} if warm else {}),
                "settings": self.settings.to_json(),
                "library": str(self.scratch / f"{name}.so"),
                "placed_on": sorted({p.backend for p in parts}),
            }
            if held:
                request.update(held=self.held_key, parts=parts_to_json(parts))
            else:
                request["module"] = str(self.scratch / f"{name}.json")
            requests.append(request)
        libraries: list[Optional[Path]] = [None] * len(requests)
        pending, lock, cutting = list(range(len(requests))), threading.Lock(), threading.Lock()
        bar = ProgressBar(len(requests), f"building placements, {workers} at once", enabled=self.show_progress)

        def build_some() -> None:
            while True:
                with lock:
                    if not pending:
                        return
                    index = pending.pop(0)
                request = requests[index]
                try:
                    if "module" in request:  # one at a time: cutting the model into partitions is not safe in several threads
                        with cutting:
                            Path(request["module"]).write_text(tvm_compat.save_ir_json(self.partitioned(placements[index])))
                    self._run_in_worker(request, run_limit_s)
                    libraries[index] = Path(request["library"])
                except StageTooSlow:  # built and written whole before it ran: its timing stops it again, at its own limit
                    libraries[index] = Path(request["library"])
                except Exception as error:  # built again where it is measured, which says what failed
                    log.debug("placement %d not built ahead: %s", index, error)
                    remove_prebuilt(Path(request["library"]))
                finally:
                    for key in ("outputs", "module"):
                        if key in request:
                            Path(request[key]).unlink(missing_ok=True)
                with lock:
                    bar.advance(f"placement of {len(placements[index])} partitions")

        threads = [threading.Thread(target=build_some, daemon=True) for _ in range(min(workers, len(requests)))]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            bar.close()
            inputs_path.unlink(missing_ok=True)
        return libraries

    def run_built(
        self,
        parts,
        library: Optional[Path],
        cutoff_s: Optional[float] = None,
        run_limit_s: Optional[float] = None,
        mod=None,
        cuda_graphs: Optional[bool] = None,
        prebuilt: Optional[Path] = None,
    ):
        """Build ``parts`` (None: TVM's unpartitioned build of the model; ``mod``: their module when
        the caller has it) in a fresh worker, run it on the job's inputs and time it; returns
        (outputs, cost). With ``prebuilt``, the library :meth:`prebuild` made of ``parts`` is loaded instead.

        Workers forked from a zygote that holds the model (see :func:`zygote.hold_model`) are sent
        the partitions alone and build the placement from their own copy; others are sent the
        placed module. With ``run_limit_s``, a run taking longer stops the worker:
        :class:`StageTooSlow`. The first run, which pays one-time setup, has SETUP_GRACE_S more
        (see :func:`_run_limits`). ``cuda_graphs`` overrides the settings' choice for this build.
        """
        module_path, inputs_path, outputs_path = (self.scratch / name for name in ("placed.json", "inputs.npz", "outputs.npz"))
        np.savez(inputs_path, *self.inputs)
        if self.remote is not None:  # built here for the servers' CPU, run there: the library travels
            library = library or self.scratch / "remote-placement.so"
        request = {
            "op": "run_placement",
            "target": tvm_compat.target_to_json(self.target),
            "inputs": str(inputs_path),
            "outputs": str(outputs_path),
            "settings": attrs.evolve(
                self.settings, cutoff_s=cutoff_s, cuda_graphs=self.settings.cuda_graphs if cuda_graphs is None else cuda_graphs
            ).to_json(),
            "library": str(library) if library else None,
        }
        if prebuilt is not None:
            request["prebuilt"] = str(prebuilt)
        if self.remote is not None:
            used = [self.backends[name] for name in sorted({p.backend for p in parts or ()}) if name in self.backends]
            request["remote"] = self.remote.request([path for backend in used for path in self.remote.carried.get(backend.name, ())])
        for attempt in range(REMOTE_ATTEMPTS if self.remote is not None else 1):
            if self.remote is not None and not self.remote.listed():
                raise CollageError(
                    f"no server of key {self.remote.key!r} is listed at the RPC tracker {self.remote.tracker} any more, to run "
                    "the placement on: start the servers again and rerun (every cost measured is kept)"
                )
            try:
                response = self._respond(parts, mod, request, module_path, run_limit_s)
                break
            except CollageError as error:
                if LOST not in str(error) or attempt == REMOTE_ATTEMPTS - 1:
                    raise
                log.warning("%s; measured again on another server", str(error).split(LOST + ": ")[-1])
        outputs = load_arrays(outputs_path)
        for path in (inputs_path, outputs_path):
            path.unlink(missing_ok=True)
        return outputs, Cost.from_json(response["cost"])

    def _respond(self, parts, mod, request: dict, module_path: Path, run_limit_s: Optional[float]) -> dict:
        """``request`` answered by a fresh worker: sent the partitions alone when its zygote holds the model, else
        the placed module (``mod``, or ``parts`` applied to the model); nothing when it loads a prebuilt library."""
        if "prebuilt" in request:
            return self._run_in_worker(request, run_limit_s)
        # A worker holding the model has Relax, not the original file an engine's own session runs: that is sent lowered.
        held = parts is not None and not original_model.engine_of(parts) and self._model_held()
        response = None
        if held:
            try:
                response = self._run_in_worker({**request, "held": self.held_key, "parts": parts_to_json(parts)}, run_limit_s)
            except HeldElsewhere:
                pass  # sent whole below
        try:
            if response is None:
                if mod is None:
                    mod = self.imported.mod if parts is None else self.partitioned(parts)
                module_path.write_text(tvm_compat.save_ir_json(mod))
                response = self._run_in_worker({**request, "module": str(module_path)}, run_limit_s)
        finally:
            module_path.unlink(missing_ok=True)
        return response

    def _run_in_worker(self, request: dict, run_limit_s: Optional[float]) -> dict:
        try:
            with MeasurementWorker(self.plugin_modules, self.disabled) as worker:
                return worker.request(
                    request,
                    self.settings.timeout_s + BUILD_TIMEOUT_S,
                    stage_limits=None if run_limit_s is None else run_limits(run_limit_s),
                )
        except StageTooSlow:
            raise
        except WorkerFailure as failure:
            if "held" in request and "does not hold model" in str(failure):
                raise HeldElsewhere from None  # a zygote started since (the environment changed): send the module
            raise CollageError(f"building or running the placement failed: {failure}") from None

    def _model_held(self) -> bool:
        """Whether the zygote holds this job's model (asked to, the first time), so workers forked from it build
        placements sent as partitions (see :func:`zygote.hold_model`)."""
        held = zygote.hold_model(self.plugin_modules, self.disabled, self.held_key, self._write_model)
        (self.scratch / "model.json").unlink(missing_ok=True)
        return held

    def _write_model(self) -> Path:
        """The model saved as IR JSON for a zygote to hold (it reads it at once; see :meth:`run_built`)."""
        path = self.scratch / "model.json"
        path.write_text(tvm_compat.save_ir_json(self.imported.mod))
        return path


def remove_prebuilt(library: Path) -> None:
    """A library :meth:`Job.prebuild` made, and the runtime file beside it, removed."""
    for path in (library, runtime_file(library)):
        path.unlink(missing_ok=True)


def parts_to_json(parts) -> list[dict]:
    """Partitions as a worker holding the model reads them (``run_placement`` with ``held``)."""
    return [{"backend": p.backend, "pattern": p.pattern, "nodes": list(p.nodes)} for p in parts]


class HeldElsewhere(Exception):
    """The worker came from a zygote that does not hold the model: the placed module is sent."""


def placement_claim_lifetime_s(settings: MeasureSettings) -> float:
    """The longest building and measuring one placement may take, and so its claim: its worker's
    start, build and runs, once more after a transient failure."""
    return 2 * (START_TIMEOUT_S + BUILD_TIMEOUT_S + settings.timeout_s)


def claimed_end_to_end(db, key: str, lifetime_s: float, say, what: str) -> Claim:
    """The cost of the whole placement under ``key`` in ``db``, measured by this run or another; or the
    claim to measure it here, granted unless another live run held it for longer than ``lifetime_s``
    (then it is measured here too, with a warning). ``what`` names it in what is said."""
    claim = db.claim_end_to_end(key, lifetime_s)
    if claim.cost is not None or claim.granted:
        return claim
    say(f"  {what}: another run is measuring it, waiting for its cost")
    deadline = time.monotonic() + lifetime_s
    while time.monotonic() < deadline:
        time.sleep(CLAIM_POLL_S)
        claim = db.claim_end_to_end(key, lifetime_s)
        if claim.cost is not None or claim.granted:
            return claim
    log.warning("%s: another run has been measuring it for over %g s; measured here", what, lifetime_s)
    return claim


class EndToEndEvaluator:
    """Measures a placement end to end in a fresh worker, once per placement (kept in the cost database).

    ``spent_s`` adds up what each measurement took, those read from the database at what they
    took when measured: a search budgeted by it stops at the same point on a warm database as it
    did when it measured, and so returns the same placement.

    Runs sharing the database measure each placement once in all: a placement is claimed (or
    found measured) just before it is measured, and one another live run claimed is waited for,
    up to ``claim_lifetime_s`` (default: :func:`placement_claim_lifetime_s` of default settings),
    then measured here.
    """

    def __init__(self, job: "Job", db, cut_off: bool, claim_lifetime_s: Optional[float] = None):
        self.job, self.db, self.cut_off = job, db, cut_off
        self.claim_lifetime_s = placement_claim_lifetime_s(MeasureSettings()) if claim_lifetime_s is None else claim_lifetime_s
        self.best_s = math.inf
        self.spent_s = 0.0
        self.from_database = 0
        # Libraries :meth:`prepare` built, by key: (path, its share of the seconds building them took).
        self.prebuilt: dict[str, tuple[Path, float]] = {}

    def prepare(self, placements) -> int:
        """Build those of ``placements`` that are not measured yet ``parallel_builds()`` at once (see
        :meth:`Job.prebuild`), so that measuring each then only loads, runs and times it: a search that knows the
        placements it will measure next hands them here first. Each is charged an even share of the wall time
        the builds took, with what measuring it takes. Nothing is built ahead with one build worker, for servers
        (a placement is built for them as it is measured), or for an engine's own session. Gives how many were built."""
        workers = self.job.settings.parallel_builds()
        if workers < 2 or self.job.remote is not None:
            return 0
        todo: dict[str, Any] = {}
        for parts in placements:
            if original_model.engine_of(parts):
                continue
            key = self.job.end_to_end_key(parts)
            if key in todo or key in self.prebuilt or self._stored(key):
                continue
            todo[key] = parts
        if len(todo) < 2:
            return 0
        started = time.perf_counter()
        libraries = self.job.prebuild(list(todo.values()), workers, run_limit_s=self._limits()[1])
        share_s = (time.perf_counter() - started) / len(todo)
        for key, library in zip(todo, libraries):
            if library is not None:
                self.prebuilt[key] = (library, share_s)
        return sum(1 for library in libraries if library is not None)

    def discard_prebuilt(self) -> None:
        """Remove the libraries :meth:`prepare` built that were not measured (the search stopped first)."""
        while self.prebuilt:
            remove_prebuilt(self.prebuilt.popitem()[1][0])

    def _run(self, parts, cutoff: Optional[float], limit: Optional[float], prebuilt: Optional[Path]) -> Cost:
        """``parts`` run and timed in a fresh worker, from ``prebuilt`` where :meth:`prepare` made it (removed after;
        a library that fails to load or run is built again, and what fails then is reported)."""
        if prebuilt is None:
            return self.job.run_built(parts, None, cutoff_s=cutoff, run_limit_s=limit)[1]
        try:
            return self.job.run_built(parts, None, cutoff_s=cutoff, run_limit_s=limit, prebuilt=prebuilt)[1]
        except CollageError as error:
            reraise_interrupt(error)
            log.debug("the prebuilt library of a placement failed (%s): built again", error)
            return self.job.run_built(parts, None, cutoff_s=cutoff, run_limit_s=limit)[1]
        finally:
            remove_prebuilt(prebuilt)

    def _limits(self) -> tuple[Optional[float], Optional[float]]:
        """The cutoff a placement measured now is judged by (None: none yet), and the run limit that stops its worker:
        a run far slower than the cutoff stops it, so a placement whose one run takes seconds against a best of
        milliseconds is not run again (BERT-base on 2 cores: 30 s a run)."""
        if not (self.cut_off and math.isfinite(self.best_s)):
            return None, None
        cutoff = CUTOFF_FACTOR * self.best_s
        return cutoff, max(cutoff, RUN_LIMIT_FLOOR_S)

    def _stored(self, key: str) -> bool:
        try:
            return self.db.get_end_to_end(key) is not None
        except CostDatabaseError:
            return False

    def __call__(self, parts) -> Cost:
        job = self.job
        key = job.end_to_end_key(parts)
        claim = self._claimed(key, parts)
        if claim.cost is not None:
            cost = claim.cost
            self.from_database += 1
            self.best_s = min(self.best_s, cost.seconds)
            self.spent_s += claim.effort_s
            if cost.repeats > 1:
                job.measured_end_to_end[signature(parts)] = cost
            return cost
        try:
            cost, effort_s = self._measured(parts, key)
        except BaseException:
            if claim.granted:  # it lapses with this process anyway: a database that cannot be written costs nothing
                with contextlib.suppress(CostDatabaseError):
                    self.db.release_end_to_end(key)
            raise
        self.spent_s += effort_s
        self.db.put_end_to_end(key, cost, effort_s=effort_s)
        return cost

    def _claimed(self, key: str, parts) -> Claim:
        """The placement's cost, measured by this run or another; or the claim to measure it here,
        granted unless another live run held it for longer than its measurement may take."""
        return claimed_end_to_end(self.db, key, self.claim_lifetime_s, self.job.say, f"placement of {len(parts)} partitions")

    def _measured(self, parts, key: str) -> tuple[Cost, float]:
        """The placement measured here (from its prebuilt library where :meth:`prepare` made one), and the
        seconds that took, its share of the prebuilding included."""
        job = self.job
        cutoff, limit = self._limits()
        prebuilt, built_s = self.prebuilt.pop(key, (None, 0.0))
        started = time.perf_counter() - built_s
        try:
            cost = self._run(parts, cutoff, limit, prebuilt)
            self.best_s = min(self.best_s, cost.seconds)
            if cost.repeats > 1:
                job.measured_end_to_end[signature(parts)] = cost
            job.say(f"  placement of {len(parts)} partitions: {describe_cost(cost)}, best {self.best_s * 1e3:.3f} ms")
        except StageTooSlow:
            cost = stopped(limit)
            job.say(f"  placement of {len(parts)} partitions: stopped, a run took longer than {limit:g} s, best {self.best_s * 1e3:.3f} ms")
        except CollageError as error:
            reraise_interrupt(error)
            cost = Cost.invalid(str(error))
        return cost, time.perf_counter() - started


def run_limits(run_limit_s: float) -> dict:
    """The worker's stage limits for runs judged by ``run_limit_s``: the first run after the build
    pays one-time setup, so it may take SETUP_GRACE_S longer; the run after it gets ``run_limit_s``."""
    return {"built": run_limit_s + SETUP_GRACE_S, "set up": run_limit_s}


def describe_cost(cost: Cost) -> str:
    if not cost.is_measured:
        return f"invalid ({cost.reason})"
    cut = " (cut off after one run)" if cost.repeats == 1 else ""
    held_up = f" (held up: its threads waited for a processor {cost.held_up_share:.0%} of its time, summed)" if cost.held_up else ""
    return f"{cost.median_s * 1e3:.3f} ms{cut}{held_up}"


def sixteen_bit_operators(graph) -> list[int]:
    """The operators of ``graph`` that read or write 16-bit values (none in a float32 model)."""
    return [node for node in range(len(graph.graph.ops)) if touches_sixteen_bit(graph.call(node))]
