"""The whole job, one stage after another: import, backends, accuracy budget, candidates and measurement,
search, build, verification and comparison, and the result kept. Each stage is a call into the subpackage
it belongs to that returns a record."""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

import attrs

from collage_core.api_checks import EXAMPLE_INPUTS, ArgumentError, refuse_unless_met, refuse_unwritable_output
from collage_core.backends import backends_for, refuse_unknown_backends
from collage_core.build import stage as build_stage
from collage_core.errors import signals_noted
from collage_core.measure import remote as remote_servers
from collage_core.measure.job import Job
from collage_core.measure.progress import Narrator, PhaseClock
from collage_core.model import torch_onnx
from collage_core.model.model_import import is_torch_module, load_model
from collage_core.model.relax_graph import RelaxGraph
from collage_core.model.shape_profiles import at_one_shape
from collage_core.model.stage import import_model
from collage_core.model.torch_shapes import exported_for_shapes
from collage_core.optimize_shapes import optimize_for_shapes, recorded_shapes
from collage_core.options import OptimizeOptions, keyword_signature
from collage_core.outputs import output_folder, reuse
from collage_core.outputs.placement_file import holds_several_shapes
from collage_core.outputs.profiled_result import ProfiledModel
from collage_core.outputs.result import OptimizedModel, kept
from collage_core.plugins import get_plugin_manager
from collage_core.search import accuracy_stage, tuning_stage
from collage_core.search import stage as search_stage


@signals_noted()
def optimize(
    model: Any, *, example_inputs: Optional[Sequence[Any]] = None, options: Optional[OptimizeOptions] = None, **chosen: Any
) -> OptimizedModel | ProfiledModel:
    """Place ``model`` on the fastest mix of backends for a target, as ``options`` say (an
    :class:`OptimizeOptions`; default: every default), each option also given by its name, which wins
    over ``options``' (``optimize(model, target="cuda", backends=["tvm"])``).

    ``model`` is an ONNX path or ModelProto, a ``torch.nn.Module`` with ``example_inputs``, or a
    Relax IRModule. ``search`` is ``"op-level"`` or ``"two-level"`` (the default when a
    graph-level backend is selected). With ``placement`` (a placement file) nothing is searched:
    the file's placement is built, verified, measured end to end and returned. Measured costs are
    kept in ``cost_db`` (default: the user cache); with ``output_dir`` the two-level search's best placement so
    far is saved there as it goes (``search-best-placement.json``, removed when the run's own files are
    written). ``calibration_rounds`` re-searches of the op-level placement with per-partition charges measured end to end are tried (0: none; see
    :mod:`collage_core.search.calibration`). With ``tune_budget_s``, the backends that tune spend at most that
    many seconds on the kernels of the placement's costliest partitions, and the search runs again with the tuned
    kernels among the candidates (see :mod:`collage_core.search.tuning_stage`). With ``compare_backends`` (default: when searching, not when
    replaying) each backend alone and TVM's unpartitioned build are measured too, and the closest
    of them timed in turns with the placement: the fastest by a margin is returned instead (never
    in a replay), and the searched placement is kept as ``searched-placement.json``; ``latency="after-pause"``
    has the contest choose by the latency of the first run after a pause, not the warm one. A baseline
    whose single run takes longer than ``baseline_limit_s`` is stopped and reported as such (None:
    no limit). With ``output_dir`` too, each baseline's placement is saved there (see
    :func:`collage_core.search.baselines.baseline_file`). ``precision`` (fp32, bf16, fp16; see :mod:`collage_core.model.precision`;
    default fp32, or the placement file's) converts the model once before anything is placed; outputs
    are verified against the float32 reference within that precision's tolerance. ``layout="nhwc"`` rewrites
    every 2-d convolution channel-last first (default ``"auto"``: NHWC at bf16 or fp16 on CUDA, else ``"model"``;
    or the placement file's; see :mod:`collage_core.model.layout`). With
    ``accuracy_budget`` (bf16 or fp16 only), units of the converted model go back to float32 until the
    placement's measured error (largest |out - ref| over largest |ref|) is within the budget, and the
    outputs are verified against the budget (see :mod:`collage_core.model.accuracy_budget`; ``accuracy_blocks``
    is how many blocks the units are probed in). With ``remeasure_invalid``, every candidate and placement
    whose stored cost is invalid (a build error, a crash, a hang) is measured again instead of read; with
    ``remeasure_held_up``, every one timed while other processes held its threads up (see
    :mod:`collage_core.measure.processor_wait`).
    With ``rpc_tracker`` (``"HOST:PORT"``) and ``rpc_key``, candidates and placements are built here for the CPU of
    the servers registered under that key (``target``, or read from a server) and timed and verified on them, every
    free one at once (see :mod:`collage_core.measure.remote`); backends whose partitions call Python at run time are
    left out, and baselines are measured only when ``compare_backends`` asks (the contest in turns then runs on one
    server). With ``shapes`` (an ONNX model with symbolic
    dimensions, or a PyTorch module with ``example_inputs`` and every input's shapes listed, exported to such a
    file and checked: :mod:`collage_core.model.torch_shapes`), each shape listed is optimized and all are built
    into one library that chooses among them by the shapes of a call (a :class:`~collage_core.outputs.profiled_result.ProfiledModel`; see
    :mod:`collage_core.optimize_shapes`); a ``placement`` that is such a run's ``placements.json`` replays every shape.

    Every option is checked before anything is read (:class:`collage_core.api_checks.ArgumentError`, one line
    naming it); :class:`OptimizeOptions`' fields say what each must be.
    """
    options = OptimizeOptions.given(options, chosen)
    refuse_unless_met("example_inputs", EXAMPLE_INPUTS, example_inputs)
    if example_inputs is not None and not is_torch_module(model):
        raise ArgumentError(
            "optimize: example_inputs are a PyTorch module's; this model's inputs are its own (a model with symbolic "
            "dimensions takes the shapes to optimize for as shapes=)"
        )
    refuse_unwritable_output(options.output_dir)
    refuse_unknown_backends(get_plugin_manager(), options.backends)  # before the model is read (seconds for a large one)
    say, clock = Narrator(options.show_progress), PhaseClock()
    if options.shapes is not None and options.placement is not None:
        if holds_several_shapes(options.placement):
            raise ArgumentError("--shapes searches; a placements file of several shapes replays the shapes it names: leave --shapes out")
        # A placement of one shape (a --shapes run's shape-K/placement.json): replayed on the model at that shape.
        static, name = at_one_shape(model, options.shapes, "a replay of a placement of one shape")
        model, options = load_model(static, name=name), attrs.evolve(options, shapes=None)
    if options.shapes is not None or holds_several_shapes(options.placement):
        if is_torch_module(model):
            model = exported_for_shapes(model, example_inputs, options.shapes or recorded_shapes(options.placement))
        return optimize_for_shapes(model, options, optimize, say)
    remote = None
    if options.rpc_tracker is not None:  # before anything is built: a tracker that cannot be reached is one line
        remote = remote_servers.connect(options.rpc_tracker, options.rpc_key, options.target)
        say(f"measuring on {len(remote.servers)} server(s) of key {options.rpc_key} at {remote.tracker}: {remote.target}")
        for host, count in remote_servers.shared_hosts(remote.servers).items():
            say(
                f"{count} servers of key {options.rpc_key} run on one host, {host}: they time each other's load unless each is "
                "pinned to cores of its own (taskset -c CORES python -m tvm.exec.rpc_server ...)"
            )
        options = attrs.evolve(options, target=remote.target)
    with output_folder.for_run(options.output_dir) as folder:
        imported = import_model(model, example_inputs, options, say)
        # The folder records the model file its outputs come from once they are saved (kept), beside them.
        model_file = model if folder.kept and isinstance(model, (str, os.PathLike)) else None
        before = output_folder.recorded_model_file(folder.path) if model_file is not None else None
        if before is not None and before != os.path.realpath(model_file):
            say(f"{folder.path} holds the outputs of another model file, {before}: this run's replace them")
        pm = get_plugin_manager()
        backends = backends_for(pm, options.backends, imported.target)
        if remote is not None:
            backends = remote_servers.measurable_remotely(pm, backends, say)
            remote = attrs.evolve(remote, carried=remote_servers.carried_libraries(pm, [info.backend for info in backends]))
        search = search_stage.search_kind(options.search, backends)
        held = accuracy_stage.held_to_budget(imported, options, pm, backends, folder, say, clock, remote)
        placed_model, target = held.imported.model, imported.target
        placed_model = torch_onnx.with_onnx_original(
            placed_model, build_stage.own_sessions_wanted(placed_model, backends, options, imported.replayed, pm), say
        )
        graph = RelaxGraph.from_function(placed_model.mod["main"], placed_model.mod)
        say(f"{placed_model.name}: {len(graph.graph)} operators; backends: {', '.join(i.name for i in backends)}; target {target}")
        job = Job(placed_model, graph, target, pm, backends, options.settings, folder.path, say, options.show_progress, folder.scratch)
        job.remote = remote
        placed = search_stage.place(job, options, search, clock)
        placed = tuning_stage.tuned_and_searched_again(job, options, search, clock, placed)

        library = output_folder.library_file(folder.path, placed_model.name)
        if library.name != f"{placed_model.name}.so":
            say(f"the model's name {placed_model.name!r} is not a safe file name: its library is {library.name}")
        if folder.kept:
            output_folder.say_what_is_overwritten(folder.path, options.placement, say)
        finish = reuse.key_of_run(job, placed.parts, options) if folder.kept and options.placement is None else None
        previous = reuse.run_before(folder.path, library, finish, say, options.remeasure_held_up) if finish is not None else None
        if previous is not None:
            clock.lap("reusing the run before")
            return kept(
                OptimizedModel(
                    placed_model,
                    previous.placement,
                    library,
                    target,
                    previous.end_to_end,
                    previous.verification,
                    placed.measurement,
                    len(placed.candidates),
                    placed.search_s,
                    job.partitioned(list(previous.placement.partitions)),
                    placed.two_level,
                    phases_s=clock.phases_s,
                    accuracy=held.fit,
                    searched_placement=previous.searched_placement,
                    chosen_by=options.latency if any(row.timed_in_turns for row in previous.end_to_end) else None,
                ),
                folder,
                model_file=model_file,
            )

        # Built in the scratch and moved into the folder at the end (kept), then placement.json within milliseconds: a run
        # stopped before it saves leaves the folder's library with the placement.json that describes it.
        building = folder.scratch / "library" / library.name if folder.kept else library
        building.parent.mkdir(exist_ok=True)
        finished = build_stage.build_and_compare(job, placed, options, search, imported.replayed, building, folder, held.fit, clock)
        return kept(
            OptimizedModel(
                placed_model,
                finished.placement,
                building,
                target,
                finished.rows,
                finished.verification,
                placed.measurement,
                len(placed.candidates),
                placed.search_s,
                finished.built.partitioned,
                placed.two_level,
                phases_s=clock.phases_s,
                accuracy=held.fit,
                searched_placement=finished.searched_placement,
                replayed_from=None if options.placement is None else str(options.placement),
                chosen_by=finished.chosen_by,
            ),
            folder,
            finish,
            model_file,
        )


optimize.__signature__ = keyword_signature(optimize)
