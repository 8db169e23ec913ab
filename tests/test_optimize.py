"""The main job on the shipped model, as a user runs it: optimize, verify, save, replay, CLI."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import collage_core
from collage_core import tvm_compat
from collage_core.errors import CollageError
from collage_core.measure.timing import MeasureSettings
from collage_core.outputs.end_to_end import ONE_AFTER_ANOTHER, PLACEMENT, SEARCHED, EndToEnd
from collage_core.outputs.placement_file import PlacementFileError
from collage_core.outputs.report import render_report
from collage_core.outputs.result import SEARCHED_PLACEMENT_FILE
from collage_core.records import Cost
from collage_core.search.baselines import IN_TURNS, MAX_RIVALS, NEAR_RIVAL, RIVALS, TURNS_MARGIN, baseline_file, closest_rivals

MODELS = Path(__file__).resolve().parents[1] / "models"
TINY_RESNET = MODELS / "tiny_resnet.onnx"
TINY_BERT = MODELS / "tiny_bert.onnx"


def quick_turns(monkeypatch) -> None:
    """The optimizer times the placement and its rivals in turns with one worker each for two short
    rounds, not seven rounds of two workers each (about 20 s for two libraries, most of it starting
    workers). For tests that check what the contest decides, not how long it times:
    test_the_closest_baselines_are_timed_in_turns_with_the_placement runs it at the default rounds and bursts."""
    from collage_core.build import stage as build_stage
    from collage_core.measure import in_turns

    quick = in_turns.TurnSettings(rounds=2, burst_s=0.05, workers_per_library=1, pause_s=0.0)
    monkeypatch.setattr(build_stage, "time_in_turns", functools.partial(in_turns.time_in_turns, settings=quick))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return tmp_path_factory.mktemp("optimize")


@pytest.fixture(scope="module")
def costs(shared_cost_db):
    """The cost database this module's optimizations share: the session's (tests/conftest.py), so TVM's
    and DNNL's candidates test_mlf measured in the same run are read, not measured again; run alone,
    the module measures them itself. Tests of a cold database make their own."""
    return shared_cost_db


# Few short repeats per timing: what the tests check does not depend on how precisely a cost is timed.
QUICK_TIMING = MeasureSettings(min_repeats=2, max_repeats=3, min_repeat_ms=1.0, time_bound_s=1.0)


@pytest.fixture(scope="module")
def optimized(workspace, costs):
    with pytest.MonkeyPatch.context() as monkeypatch:
        quick_turns(monkeypatch)
        return collage_core.optimize(
            str(TINY_RESNET), backends=["tvm"], cost_db=costs, output_dir=workspace / "out", settings=QUICK_TIMING, show_progress=False
        )


def test_optimize_measures_searches_builds_and_verifies(optimized):
    assert optimized.verification.passed, optimized.verification.describe()
    assert optimized.verification.reference.startswith("onnxruntime")
    placement = optimized.placement
    covered = sorted(n for p in placement.partitions for n in p.nodes)
    assert covered == list(range(len(placement.operators)))
    assert all(p.cost.is_measured for p in placement.partitions)  # a merged region's is its partitions', summed
    assert any(p.cost.is_measured for p in optimized.placement.considered)
    assert optimized.measurement.distinct <= optimized.candidates
    names = [entry.name for entry in optimized.end_to_end]
    assert names[0] == "placement" and "tvm alone" in names and "unpartitioned relax.build" in names
    assert all(entry.cost.is_measured and entry.cost.median_s > 0 for entry in optimized.end_to_end)


def test_the_report_says_where_the_time_went(optimized, workspace):
    phases = optimized.phases_s
    assert list(phases)[:5] == [
        "import and candidates",
        "measuring candidates",
        "search and calibration",
        "building and verifying",
        "baselines",
    ]
    assert all(seconds >= 0 for seconds in phases.values()) and phases["building and verifying"] > 0
    saved = json.loads((workspace / "out" / "results.json").read_text())["phases_s"]
    assert saved == phases
    line = next(line for line in (workspace / "out" / "report.txt").read_text().splitlines() if line.startswith("time: "))
    assert line.endswith(f"{sum(phases.values()):.1f} s in all") and "baselines" in line


def test_run_matches_reference(optimized):
    inputs = optimized.model.random_inputs(seed=3)
    expected = optimized.model.reference(inputs)
    np.testing.assert_allclose(optimized.run(*inputs)[0], expected[0], rtol=1e-4, atol=1e-4)


def test_run_prepares_each_backends_runtime_before_loading_the_library(optimized, monkeypatch):
    """The partitions' kernels may have been loaded only in the workers that measured them (CUTLASS's
    tuned kernels are): running in this process asks each backend's plugin to prepare first."""
    import attrs

    from collage_core.build import deploy

    prepared = []
    original = deploy.prepare_runtime
    monkeypatch.setattr(deploy, "prepare_runtime", lambda library, pm=None: prepared.append(library) or original(library, pm))
    fresh = attrs.evolve(optimized, vm=None)
    inputs = optimized.model.random_inputs(seed=5)
    np.testing.assert_array_equal(fresh.run(*inputs)[0], optimized.run(*inputs)[0])
    assert [str(path) for path in prepared] == [str(optimized.library_path)]


def test_placement_file_replays_the_same_executable(optimized, workspace, caplog):
    saved = workspace / "out" / "placement.json"
    data = json.loads(saved.read_text())
    assert data["format"] == "collage-placement" and data["version"] == 1
    assert data["model"]["name"] == "tiny_resnet"
    assert all(p["cost"]["kind"] == "measured" for p in data["partitions"])
    with caplog.at_level(logging.WARNING, logger="collage"):
        replayed = collage_core.optimize(
            str(TINY_RESNET),
            placement=saved,
            backends=["tvm"],
            output_dir=workspace / "replay",
            compare_backends=False,
            show_progress=False,
        )
    assert not [r for r in caplog.records if "another version" in r.getMessage()]  # made for this very model
    assert replayed.measurement is None
    assert tvm_compat.structural_equal(replayed.partitioned_mod, optimized.partitioned_mod)
    inputs = optimized.model.random_inputs(seed=5)
    np.testing.assert_array_equal(replayed.run(*inputs)[0], optimized.run(*inputs)[0])


def test_a_placement_made_for_another_version_of_the_model_says_its_costs_are_that_models(optimized, workspace, caplog):
    """Same operators, another fingerprint (a module replayed at another batch): the replay runs, and says that the
    costs it carries were measured on the other model."""
    data = json.loads((workspace / "out" / "placement.json").read_text())
    data["model"]["fingerprint"] = "0123456789abcdef"
    data["model"]["name"] = "resnet_before_retraining"
    other = workspace / "made-for-another-version.json"
    other.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="collage"):
        replayed = collage_core.optimize(str(TINY_RESNET), placement=other, backends=["tvm"], compare_backends=False, show_progress=False)
    # the report and results.json say so too, not only the warning on stderr
    assert replayed.placement.why_chosen.startswith(f"replayed from {other}")
    assert "made for another version of this model (its fingerprint is 0123456789abcdef" in replayed.placement.why_chosen
    # the report is of the model built here, under its own name, not the name the file carries
    assert render_report(replayed).splitlines()[0].startswith(f"Model {optimized.model.name}: ")
    warned = [r.getMessage() for r in caplog.records if "another version" in r.getMessage()]
    assert warned == [
        f"{other} was made for another version of this model (its fingerprint is 0123456789abcdef, this model's "
        f"{optimized.model.fingerprint}: other shapes or attributes, or another file): its partitions' costs are that model's, "
        "not measured here"
    ]


@pytest.mark.parametrize(
    "backend, nodes, message",
    [
        ("dnnl", "all", "names pattern dnnl.whole_model, but backend dnnl does not build whole models"),
        ("tvm", "first", "holds 1 of this model's 45 operators, where a whole-model build holds every one"),
    ],
)
def test_a_placement_naming_a_whole_model_build_that_cannot_be_is_refused_when_read(optimized, workspace, backend, nodes, message):
    """Only a backend that builds whole models (TVM) has a ``<backend>.whole_model`` partition, and it holds every
    operator: a file saying otherwise is refused by name as it is read, not by a lowering failing later."""
    data = json.loads((workspace / "out" / "placement.json").read_text())
    part = dict(data["partitions"][0], backend=backend, pattern=f"{backend}.whole_model", key=f"{backend}.whole_model:edited")
    count = len(data["model"]["operators"])
    if nodes == "all":
        data["partitions"] = [dict(part, operators=list(range(count)))]
    else:  # every operator covered once, in two "whole-model" partitions
        data["partitions"] = [dict(part, operators=[0]), dict(part, operators=list(range(1, count)))]
    data["original_model"] = None
    edited = workspace / f"whole-model-{backend}.json"
    edited.write_text(json.dumps(data))
    with pytest.raises(CollageError, match=re.escape(f"{edited}: partition 0 ") + ".*" + re.escape(message)):
        collage_core.optimize(str(TINY_RESNET), placement=edited, backends=["tvm", "dnnl"], compare_backends=False, show_progress=False)


def test_a_placement_measured_on_another_device_says_so_and_the_report_names_where_it_ran(optimized, workspace, caplog):
    data = json.loads((workspace / "out" / "placement.json").read_text())
    data["device"] = "cuda:sm_90a (NVIDIA H200, compute capability 9.0, CUDA 13.0, driver 580.159.04)"
    elsewhere = workspace / "measured-elsewhere.json"
    elsewhere.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="collage"):
        replayed = collage_core.optimize(
            str(TINY_RESNET), placement=elsewhere, backends=["tvm"], compare_backends=False, show_progress=False
        )
    here = tvm_compat.device_name(tvm_compat.host_cpu_target())
    warned = [r.getMessage() for r in caplog.records if "replayed on" in r.getMessage()]
    assert warned == [f"{elsewhere} was measured on {data['device']} and is replayed on {here}: its costs and choices may not hold here"]
    assert replayed.placement.ran_on == here
    assert f"operators on {here}, op-level search (placement measured on cuda:sm_90a (NVIDIA H200" in render_report(replayed)


def test_tvms_unpartitioned_build_is_a_placement_that_can_be_returned_and_replayed(optimized, workspace):
    from collage_core.outputs.placement_file import load_placement
    from collage_core.search.regions import whole_model_pattern

    entry = next(e for e in optimized.end_to_end if e.name == "unpartitioned relax.build")
    assert entry.cost.is_measured
    saved = baseline_file(workspace / "out", "unpartitioned relax.build")
    whole = load_placement(saved)
    assert [(p.backend, p.pattern, p.nodes) for p in whole.partitions] == [
        ("tvm", whole_model_pattern("tvm"), tuple(range(len(whole.operators))))
    ]
    replayed = collage_core.optimize(str(TINY_RESNET), placement=saved, backends=["tvm"], compare_backends=False, show_progress=False)
    assert replayed.verification.passed, replayed.verification.describe()


def test_placement_for_another_model_is_refused(optimized, workspace):
    with pytest.raises(PlacementFileError, match=r"operator \d+ is .* in the placement but .* in the model"):
        collage_core.optimize(str(TINY_BERT), placement=workspace / "out" / "placement.json", show_progress=False)


def test_library_runs_in_a_fresh_process(optimized, workspace):
    """It loads quietly, too: a library exported after a VM was made from its executable printed TVM's
    "Scope Loaded" warning once per constant on every load."""
    inputs = optimized.model.random_inputs(seed=9)
    np.save(workspace / "input.npy", inputs[0])
    script = (
        "import sys, numpy as np, tvm\n"
        "from tvm import relax\n"
        "vm = relax.VirtualMachine(tvm.runtime.load_module(sys.argv[1]), tvm.cpu())\n"
        "out = vm['main'](tvm.runtime.tensor(np.load(sys.argv[2])))\n"
        "np.save(sys.argv[3], out.numpy())\n"
    )
    library = workspace / "out" / "tiny_resnet.so"
    loaded = subprocess.run(
        [sys.executable, "-c", script, str(library), str(workspace / "input.npy"), str(workspace / "o.npy")],
        check=True,
        capture_output=True,
        text=True,
    )
    assert "Scope Loaded" not in loaded.stderr, loaded.stderr[-2000:]
    np.testing.assert_allclose(np.load(workspace / "o.npy"), optimized.run(*inputs)[0], rtol=1e-6, atol=1e-6)


def test_cli_optimize_reuses_measured_costs(optimized, workspace, costs):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "collage_core.cli",
            "optimize",
            str(TINY_RESNET),
            "--cost-db",
            str(costs),
            "--output",
            str(workspace / "cli"),
            "--no-compare",
            "--calibration-rounds",
            "0",
            "--backends",
            "tvm",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "measured 0 in" in result.stdout and "numerics passed" in result.stdout
    assert "end to end" in result.stdout and "share of op-level time" in result.stdout
    assert (workspace / "cli" / "placement.json").exists() and (workspace / "cli" / "tiny_resnet.so").exists()


def test_dash_o_and_double_dash_output_name_the_same_directory():
    from collage_core.cli import _parser

    for spelling in ("-o", "--output"):
        assert _parser().parse_args(["optimize", "model.onnx", spelling, "somewhere"]).output_dir == "somewhere"


def test_cli_backends_lists_tvm():
    result = subprocess.run([sys.executable, "-m", "collage_core.cli", "backends"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    row = next(line for line in result.stdout.splitlines() if line.startswith("tvm "))
    assert "op-level" in row and "yes" in row


def test_cli_reports_a_missing_model_in_one_line_and_leaves_no_output_folder(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "collage_core.cli", "optimize", str(tmp_path / "nope.onnx")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [f"collage: error: {tmp_path / 'nope.onnx'}: no such file"]
    assert not (tmp_path / "collage-out").exists()


def test_optimize_torch_module_is_verified_against_pytorch(costs):
    torch = pytest.importorskip("torch")

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x):
            y = torch.relu(self.conv(x))
            return self.fc((y + y.mean()).mean(dim=(2, 3)))

    torch.manual_seed(0)
    result = collage_core.optimize(
        Block(), example_inputs=(torch.randn(1, 3, 8, 8),), backends=["tvm"], cost_db=costs, show_progress=False, compare_backends=False
    )
    assert result.verification.passed and result.verification.reference.startswith("pytorch")


def test_a_torch_module_numbering_its_positions_from_a_mask_is_optimized_and_matches_pytorch(costs):
    """GPT-2's position ids, ``(ids != pad).cumsum(-1)``: a running sum of booleans, which PyTorch counts in int64."""
    torch = pytest.importorskip("torch")

    class Positions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens, self.positions = torch.nn.Embedding(16, 8), torch.nn.Embedding(16, 8)

        def forward(self, ids):
            positions = (ids != 0).cumsum(-1) * (ids != 0)
            return self.tokens(ids) + self.positions(positions)

    torch.manual_seed(0)
    model, ids = Positions(), torch.tensor([[5, 3, 0, 7, 9, 0, 0, 2]])
    result = collage_core.optimize(
        model, example_inputs=(ids,), backends=["tvm"], cost_db=costs, show_progress=False, compare_backends=False
    )
    assert result.verification.passed
    other = torch.tensor([[0, 0, 4, 4, 4, 1, 0, 15]])  # other positions than the example's
    with torch.no_grad():
        np.testing.assert_allclose(result.run(other.numpy())[0], model(other).numpy(), rtol=1e-6, atol=1e-6)


def test_a_torch_module_gets_the_two_level_search_with_a_graph_level_backend(costs):
    """The torch.export route meets the same searches as an ONNX file: ONNX Runtime regions of a
    PyTorch module are evolved end to end, and the result is verified against PyTorch."""
    torch = pytest.importorskip("torch")
    from collage_core.backends import discover_backends
    from collage_core.plugins import get_plugin_manager
    from collage_core.search.two_level import TwoLevelSettings

    infos = discover_backends(get_plugin_manager())
    if "onnxruntime" not in infos or not infos["onnxruntime"].availability.available:
        pytest.skip("the ONNX Runtime backend is not available here")

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)

        def forward(self, x):
            return self.fc2(torch.nn.functional.gelu(self.fc1(x))).softmax(-1)

    torch.manual_seed(0)
    result = collage_core.optimize(
        Block(),
        example_inputs=(torch.randn(4, 16),),
        backends=["tvm", "onnxruntime"],
        search="two-level",
        two_level=TwoLevelSettings(population=4, generations=1),
        cost_db=costs,
        compare_backends=False,
        calibration_rounds=0,
        show_progress=False,
    )
    assert result.model.source == "torch" and result.placement.search == "two-level"
    assert result.two_level is not None and result.two_level.history
    assert result.verification.passed and result.verification.reference.startswith("pytorch")


def test_baseline_slower_than_the_limit_is_stopped_and_reported(optimized, workspace, costs):
    """A limit no run can meet stops every baseline after its build; the placement itself is still timed
    (and a baseline that is the placement, here TVM alone, reuses its cost)."""
    from collage_core.measure.timing import STOPPED_PREFIX

    limited = collage_core.optimize(
        str(TINY_RESNET),
        backends=["tvm"],
        cost_db=costs,
        output_dir=workspace / "limited",
        baseline_limit_s=1e-6,
        calibration_rounds=0,
        show_progress=False,
    )
    placement, *baselines = limited.end_to_end
    assert placement.cost.is_measured
    stopped = [b for b in baselines if b.cost != placement.cost]
    assert [b.name for b in stopped][0] == "unpartitioned relax.build"
    assert all(not b.cost.is_measured and b.cost.reason.startswith(STOPPED_PREFIX) for b in stopped)


def test_a_run_slower_than_single_run_s_is_timed_once(optimized, workspace, costs):

    once = collage_core.optimize(
        str(TINY_RESNET),
        backends=["tvm"],
        cost_db=costs,
        output_dir=workspace / "once",
        settings=MeasureSettings(single_run_s=0.0),
        compare_backends=False,
        calibration_rounds=0,
        show_progress=False,
    )
    assert once.end_to_end[0].cost.repeats == 1 and once.end_to_end[0].cost.median_s > 0
    assert once.placement.why_chosen == "found by the op-level search; not compared with baselines"


@pytest.mark.slow  # a minute on 2 cores; the turns are also covered by the tests after it, with fewer rounds
def test_the_closest_baselines_are_timed_in_turns_with_the_placement(workspace, costs, monkeypatch):
    """Timed in turns, each in workers of its own; the result is the fastest of them, or the searched
    placement when none beat it by the margin. ONNX Runtime is offered so that a rival is certain: its
    whole-graph build has no summed cost to predict it out of the contest, while TVM alone may be (when
    its convolutions measure over ten times DNNL's)."""
    from collage_core.build import stage as build_stage
    from collage_core.measure import in_turns

    # Default rounds and bursts, one worker per library, not two (two workers' runs are pooled in
    # test_each_library_is_timed_in_turns_by_its_own_workers[2]): half the workers to start and turns to take.
    one_worker = in_turns.TurnSettings(workers_per_library=1)
    monkeypatch.setattr(build_stage, "time_in_turns", functools.partial(in_turns.time_in_turns, settings=one_worker))
    result = collage_core.optimize(
        str(TINY_RESNET),
        backends=["tvm", "dnnl", "onnxruntime"],
        cost_db=costs,
        output_dir=workspace / "turns",
        search="op-level",
        calibration_rounds=0,
        show_progress=False,
    )
    turns = {e.name: e for e in result.end_to_end if e.timed_in_turns}
    assert 2 <= len(turns) <= 1 + MAX_RIVALS and all(e.cost.repeats >= 7 for e in turns.values())
    returned = turns.pop(PLACEMENT)
    assert result.end_to_end[0] == returned and result.latency() == returned.cost  # the headline is timed in turns
    searched = turns.pop(f"{SEARCHED}, {IN_TURNS}", None)
    if searched is None:  # the searched placement was returned: no rival beat it by the margin
        assert all(e.cost.seconds >= returned.cost.seconds * (1 - TURNS_MARGIN) for e in turns.values())
    else:  # the fastest rival was returned
        assert returned.cost.seconds < searched.cost.seconds * (1 - TURNS_MARGIN)
        assert all(e.cost.seconds >= returned.cost.seconds for e in turns.values())
    assert not (workspace / "turns" / "rivals").exists()


def recorded_builds(monkeypatch) -> list:
    """The library path (None: not kept) of every build the optimizer makes from now on, in order."""
    from collage_core.measure.job import Job

    run_built, builds = Job.run_built, []

    def recorded(self, parts, library, *args, **kwargs):
        builds.append(library)
        return run_built(self, parts, library, *args, **kwargs)

    monkeypatch.setattr(Job, "run_built", recorded)
    return builds


@pytest.mark.slow
def test_a_baseline_faster_in_turns_becomes_the_result_without_building_it_again(workspace, costs, monkeypatch):
    """The last rival ran fastest in turns (made so here): its build, timed in turns, is the result's
    library, verified and returned; the searched placement stays in the table under its own name."""
    from collage_core.build import stage as build_stage

    def last_rival_fastest(libraries, *args, **kwargs):
        *others, last = libraries
        return {
            **{name: alike_in_turns(Cost.measured(2e-3, 1e-5, 20)) for name in others},
            last: alike_in_turns(Cost.measured(1e-3, 1e-5, 20)),
        }

    monkeypatch.setattr(build_stage, "time_in_turns", last_rival_fastest)
    # DNNL's candidates cost half TVM's (a deterministic cost model): the search places DNNL wherever it
    # can, and TVM alone stays a rival of another placement, whatever the machine's load.
    op_level_costs_from(monkeypatch, lambda candidate, ops: Cost.measured(1e-3 if candidate.backend == "dnnl" else 2e-3, 0.0, 1))
    builds = recorded_builds(monkeypatch)
    result = collage_core.optimize(
        str(TINY_RESNET),
        backends=["tvm", "dnnl"],
        cost_db=costs,
        output_dir=workspace / "drift",
        search="op-level",
        calibration_rounds=0,
        show_progress=False,
    )
    names = [entry.name for entry in result.end_to_end]
    assert names[:2] == [PLACEMENT, f"{SEARCHED}, {IN_TURNS}"]
    assert result.latency() == Cost.measured(1e-3, 1e-5, 20)  # what it won by, in turns
    rival = [e for e in result.end_to_end if e.name.endswith(ONE_AFTER_ANOTHER)][0]
    assert rival.name == f"{PLACEMENT}, {ONE_AFTER_ANOTHER}"
    assert result.end_to_end[0].operators_by_backend == rival.operators_by_backend != result.end_to_end[1].operators_by_backend
    library = workspace / "drift" / f"{result.model.name}.so"
    assert [b for b in builds if b is not None][-1].parent.parent.name == "rivals"  # not built again
    assert result.verification.passed, result.verification.describe()
    saved = json.loads((workspace / "drift" / "placement.json").read_text())
    assert sorted(p["backend"] for p in saved["partitions"]) == sorted(p.backend for p in result.placement.partitions)
    inputs = result.model.random_inputs(seed=5)
    np.testing.assert_allclose(result.run(*inputs)[0], result.model.reference(inputs)[0], rtol=1e-4, atol=1e-4)
    assert json.loads((library.parent / f"{library.name}.runtime.json").read_text())["backends"].keys() == set(
        result.end_to_end[0].operators_by_backend
    )


def candidate_costs_only(source: Path, path: Path) -> None:
    """A cost database at ``path`` holding the candidate costs in ``source`` and no end-to-end costs."""
    with contextlib.closing(sqlite3.connect(source)) as measured, contextlib.closing(sqlite3.connect(path)) as copy:
        measured.backup(copy)
        copy.execute("DELETE FROM end_to_end_costs")
        copy.commit()


@pytest.mark.slow
def test_a_warm_cost_database_returns_the_same_result_measuring_only_the_result(optimized, costs, tmp_path, monkeypatch):
    """The second run of the same command reads candidates, searched placements and baselines from the
    database: its search ends where the first one did, and the end of the first run kept in the output
    directory (library, verification, end-to-end rows) is reused: nothing is built. Without that
    record, a run builds only its result (and the closest baselines, to time them in turns).

    The first run starts with the candidate costs of the module's database, where the optimized fixture
    read or measured TVM's (so they are not measured again here: test_cli_optimize_reuses_measured_costs
    reads them back), and no searched placements or baselines."""
    pytest.importorskip("onnxruntime")
    from collage_core.search.two_level import TwoLevelSettings

    candidate_costs_only(costs, tmp_path / "costs.sqlite")

    def run():
        return collage_core.optimize(
            str(TINY_RESNET),
            backends=["tvm", "onnxruntime"],
            cost_db=tmp_path / "costs.sqlite",
            output_dir=tmp_path / "out",
            search="two-level",
            calibration_rounds=0,
            show_progress=False,
            two_level=TwoLevelSettings(population=4, generations=2),
        )

    from collage_core.outputs.placement_file import SEARCH_BEST_FILE, Placement

    quick_turns(monkeypatch)
    saved_to = []
    save = Placement.save
    monkeypatch.setattr(Placement, "save", lambda placement, path: saved_to.append(Path(path).name) or save(placement, path))
    cold = run()
    # The search's best so far went beside the run's files, never over them, and is gone once they are written.
    assert SEARCH_BEST_FILE in saved_to and saved_to[-1] == "placement.json" and not (tmp_path / "out" / SEARCH_BEST_FILE).exists()
    svg = (tmp_path / "out" / "two-level-search.svg").read_text()
    assert svg.count('class="generation"') == len(cold.two_level.history)
    # Whichever won the contest in turns here, the run says so, and the picture says when the search's best lost it.
    lost = cold.searched_placement is not None
    assert ('class="caption"' in svg) == lost == (tmp_path / "out" / SEARCHED_PLACEMENT_FILE).exists()
    if lost:
        assert cold.placement.why_chosen.endswith(
            f"the searched placement (found by the two-level search) is saved as {SEARCHED_PLACEMENT_FILE}"
        )
    else:
        assert cold.placement.why_chosen.startswith("found by the two-level search; ")
    builds = recorded_builds(monkeypatch)
    library = tmp_path / "out" / f"{cold.model.name}.so"
    built_at = library.stat().st_mtime_ns
    warm = run()
    assert builds == [] and library.stat().st_mtime_ns == built_at
    assert warm.end_to_end == cold.end_to_end and warm.verification == cold.verification
    assert warm.placement.partitions == cold.placement.partitions
    assert (
        json.loads((tmp_path / "out" / "placement.json").read_text())["partitions"]
        == json.loads(cold.placement.save(tmp_path / "cold-placement.json").read_text())["partitions"]
    )

    (tmp_path / "out" / "finished.json").unlink()
    warm = run()
    # The result's library and the closest baselines', to time them in turns: nothing else is built.
    rivals = [build for build in builds if build is not None and build.parent.parent.name == "rivals"]
    assert builds == [library, *rivals] and len(rivals) <= MAX_RIVALS
    assert warm.measurement.measured == 0
    assert cold.two_level.from_database == 0 and warm.two_level.from_database == warm.two_level.measured > 0
    assert (warm.two_level.genome, warm.two_level.generations) == (cold.two_level.genome, cold.two_level.generations)

    def entrant(name):
        """The returned placement's rows and the searched placement's, however timed."""
        return name.split(",")[0] in (PLACEMENT, SEARCHED)

    placed = [e.operators_by_backend for e in cold.end_to_end + warm.end_to_end if entrant(e.name)]

    def baselines(result):
        """Baselines other than the placements measured in either run (those share a fresh cost)."""
        return [
            (e.name, e.cost)
            for e in result.end_to_end
            if not entrant(e.name) and e.operators_by_backend not in placed and not e.timed_in_turns
        ]

    assert len(baselines(cold)) >= 3 and baselines(warm) == baselines(cold)
    # Each baseline's placement is kept beside the result, and replays into that baseline's build.
    alone = [e for e in cold.end_to_end if e.name == "onnxruntime alone"][0]
    replayed = collage_core.optimize(
        str(TINY_RESNET),
        backends=["tvm", "onnxruntime"],
        placement=baseline_file(tmp_path / "out", alone.name),
        compare_backends=False,
        show_progress=False,
    )
    assert replayed.end_to_end[0].operators_by_backend == alone.operators_by_backend == {"onnxruntime": 45}
    assert replayed.verification.passed


def test_rivals_are_the_fastest_distinct_rebuildable_baselines():
    """One rival per distinct placement, never the placement itself or TVM's unpartitioned build, none
    unmeasured or too slow to repeat, the RIVALS fastest first and any within NEAR_RIVAL of the last of
    them (at most MAX_RIVALS in all); however much slower than the placement they measured one after
    the other, and whatever the placement measured."""
    from collage_core.records import Cost, Partition

    def parts(backend):
        return [Partition(backend, "p", (0, 1), f"{backend}-key", Cost.measured(1e-3, 0.0, 1))]

    def row(name, seconds, backend):
        cost = Cost.measured(seconds, 0.0, 5) if seconds else Cost.invalid("failed")
        return EndToEnd(name, cost, {}), None if backend is None else parts(backend)

    settings = MeasureSettings()
    placed = parts("a")
    baselines = [
        row("unpartitioned", 1e-3, None),
        row("same as placed", 5e-3, "a"),
        row("too slow to repeat", settings.single_run_s * 1.5, "f"),
        row("second", 0.12, "c"),
        row("first", 0.11, "b"),
        row("first again", 0.115, "b"),
        row("broken", None, "e"),
        row("third", 0.13, "d"),
        row("far", 0.12 * (1 + NEAR_RIVAL) * 1.01, "g"),
    ]
    assert RIVALS == 2 and 0.13 <= 0.12 * (1 + NEAR_RIVAL)
    expected = ["first", "second", "third"]  # the third within NEAR_RIVAL of the second, "far" not
    for placement_s in (0.01, 0.2):
        rivals = closest_rivals(baselines, placed, Cost.measured(placement_s, 0.0, 5), settings)
        assert [entry.name for entry, _ in rivals] == expected
    slow = Cost.measured(settings.single_run_s * 2, 0.0, 1)
    assert closest_rivals(baselines, placed, slow, settings) == []
    crowd = [row(f"near {i}", 0.1 + 0.001 * i, backend) for i, backend in enumerate("bcdghij")]
    assert len(closest_rivals(crowd, placed, Cost.measured(0.1, 0.0, 5), settings)) == MAX_RIVALS


@pytest.mark.parametrize("workers", [1, 2])
def test_each_library_is_timed_in_turns_by_its_own_workers(optimized, workspace, workers):
    """Every worker of every library takes a turn each round (with no burst time, a run after its pause and one
    back to back), and a library's latencies are its fastest worker's runs, one of each a round; the same
    library under two names costs about the same."""
    from collage_core.measure.in_turns import TurnSettings, time_in_turns
    from collage_core.plugins import get_plugin_manager

    inputs = workspace / f"turn-inputs-{workers}.npz"
    np.savez(inputs, *optimized.model.random_inputs(seed=3))
    library = workspace / "out" / "tiny_resnet.so"
    settings = TurnSettings(rounds=3, burst_s=0.0, workers_per_library=workers, pause_s=0.05)
    costs = time_in_turns(
        {"a": library, "b": library},
        inputs,
        tvm_compat.target_to_json(optimized.target),
        get_plugin_manager().module_plugin_names(),
        [],
        settings,
    )
    assert set(costs) == {"a", "b"}
    assert all(turns.warm.is_measured and turns.warm.repeats == settings.rounds for turns in costs.values())
    assert all(turns.after_pause.repeats == settings.rounds for turns in costs.values())
    assert 0.5 < costs["a"].warm.seconds / costs["b"].warm.seconds < 2.0


def test_one_time_setup_in_a_first_run_is_not_charged_to_the_placement(workspace, monkeypatch):
    """A placement whose first run pays one-time setup (ONNX Runtime creates its sessions then) is
    judged and timed by the runs after it: neither timed by the slow first run alone nor stopped
    by a run limit the first run exceeds."""
    import os

    from tvm import relax

    from collage_core import optimizer
    from collage_core.plugins import get_plugin_manager

    tests = str(Path(__file__).resolve().parent)
    monkeypatch.syspath_prepend(tests)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])))
    from plugins_for_tests import lazy_setup_backend

    module = "plugins_for_tests.lazy_setup_backend"
    monkeypatch.setattr(optimizer, "get_plugin_manager", lambda: get_plugin_manager(extra_modules=[module]))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            output = bb.emit_output(relax.op.nn.relu(x))
        bb.emit_func_output(output)
    limit_s = lazy_setup_backend.SETUP_S / 2
    result = collage_core.optimize(
        bb.get(),
        backends=[lazy_setup_backend.BACKEND],
        cost_db=workspace / "lazy.sqlite",
        output_dir=workspace / "lazy",
        settings=MeasureSettings(single_run_s=limit_s),
        baseline_limit_s=limit_s,
        calibration_rounds=0,
        show_progress=False,
    )
    placement = result.end_to_end[0]
    assert placement.operators_by_backend == {lazy_setup_backend.BACKEND: 1}
    assert placement.cost.repeats > 1 and placement.cost.median_s < limit_s
    alone = next(e for e in result.end_to_end if e.name == f"{lazy_setup_backend.BACKEND} alone")
    assert alone.cost.is_measured and alone.cost.median_s < limit_s


def test_a_baseline_whose_partitions_add_up_to_ten_times_the_placement_is_not_built():
    from collage_core.records import Cost, Partition
    from collage_core.search.baselines import CANNOT_WIN_FACTOR, PREDICTED_PREFIX, predicted_cost

    def part(ms):
        return Partition("tvm", "tvm.op", (0,), "k", Cost.measured(ms / 1e3, 0.0, 5))

    op_level = [part(0.4), part(0.6)]
    slow = predicted_cost([part(6.0), part(4.5)], op_level)
    assert slow.reason == (
        f"{PREDICTED_PREFIX} its partitions' measured costs add up to 10.500 ms, over 10x the op-level placement's 1.000 ms"
    )
    assert not slow.is_measured and CANNOT_WIN_FACTOR == 10.0
    assert predicted_cost([part(6.0), part(3.9)], op_level) is None  # may win: built and measured
    region = Partition("onnxruntime", "onnxruntime.region", (1,), "r", Cost.unknown())
    assert predicted_cost([part(60.0), region], op_level) is None  # a region has no standalone cost
    assert predicted_cost([part(60.0)], [region]) is None


def op_level_costs_from(monkeypatch, cost_of) -> None:
    """The op-level candidates' costs taken from a deterministic cost model, ``cost_of(candidate, ops)``,
    instead of measuring them (their costs move with the machine's load); for tests of what the stages after
    the search decide, never a default."""
    from collage_core.measure.measurement import MeasurementReport
    from collage_core.search import stage as search_stage

    def deterministically(job, candidates, db):
        by_key = {c.key: cost_of(c, job.graph.graph.ops) for c in job.op_level_candidates(candidates)}
        return MeasurementReport(by_key, distinct=len(by_key), from_database=0, measured=0, invalid=0, seconds=0.0)

    monkeypatch.setattr(search_stage, "measure", deterministically)


def test_tvm_alone_and_the_unpartitioned_build_are_predicted_not_built_when_they_cannot_win(workspace, costs, monkeypatch):
    """When TVM's partitions add up to far more than the placement with DNNL beside it, neither TVM alone
    nor TVM's unpartitioned build is built, and the report says why. The candidates' costs come from a
    deterministic cost model, never the machine (how slow untuned TVM is against DNNL, and DNNL's own
    costs, move with the machine's load): a TVM convolution costs a second, any other TVM candidate 0.1 ms,
    a DNNL candidate 1 ms."""
    from collage_core.build import stage as build_stage
    from collage_core.records import Cost
    from collage_core.search.baselines import PREDICTED_PREFIX

    quick_turns(monkeypatch)

    def deterministic_cost(candidate, ops) -> Cost:
        if candidate.backend == "dnnl":
            return Cost.measured(1e-3, 0.0, 1)
        return Cost.measured(1.0 if any("conv2d" in ops[n] for n in candidate.nodes) else 1e-4, 0.0, 1)

    op_level_costs_from(monkeypatch, deterministic_cost)
    baseline_cost, measured = build_stage.baseline_cost, []

    def recorded(job, name, *args, **kwargs):
        measured.append(name)
        return baseline_cost(job, name, *args, **kwargs)

    monkeypatch.setattr(build_stage, "baseline_cost", recorded)
    result = collage_core.optimize(
        str(TINY_RESNET),
        backends=["tvm", "dnnl"],
        cost_db=costs,
        output_dir=workspace / "predicted",
        search="op-level",
        calibration_rounds=0,
        show_progress=False,
    )
    rows = {e.name: e.cost for e in result.end_to_end}
    for name in ("tvm alone", "unpartitioned relax.build"):
        assert rows[name].reason.startswith(PREDICTED_PREFIX), rows[name]
    assert rows["dnnl + tvm for the rest"].is_measured
    assert "tvm alone" not in measured and "unpartitioned relax.build" not in measured
    from collage_core.outputs.report import render_report

    report = render_report(result)
    assert next(line for line in report.splitlines() if line.startswith("tvm alone ")).split()[2:4] == ["not", "built:"]


def alike_in_turns(cost: Cost):
    """A library's latency in turns that is ``cost`` warm and after a pause of a second alike."""
    from collage_core.measure.in_turns import LibraryTurns

    return LibraryTurns(cost, cost, 1.0)


def forced_turns(fastest: str):
    """A contest in turns whose ``fastest`` entrant ("placement" or "last rival") runs 1 ms and every other
    2 ms: what the contest decides, whatever this machine's load does to the libraries' speeds."""

    def time_in_turns(libraries, *args, **kwargs):
        winner = PLACEMENT if fastest == "placement" else list(libraries)[-1]
        return {name: alike_in_turns(Cost.measured(1e-3 if name == winner else 2e-3, 1e-5, 20)) for name in libraries}

    return time_in_turns


def contest_on_tvm(output_dir, costs, monkeypatch, fastest: str, **options):
    """tiny_resnet on TVM alone, searched at the op level: its one rival is TVM's unpartitioned build."""
    from collage_core.build import stage as build_stage

    monkeypatch.setattr(build_stage, "time_in_turns", forced_turns(fastest))
    return collage_core.optimize(
        str(TINY_RESNET),
        backends=["tvm"],
        cost_db=costs,
        output_dir=output_dir,
        search="op-level",
        calibration_rounds=0,
        **{"show_progress": False, **options},
    )


def said(line: str) -> str:
    """A progress line without the minutes and seconds it came at."""
    return re.sub(r"^\[\d\d:\d\d\] ", "", line)


BASELINE_WON = (
    "unpartitioned relax.build won the contest in turns: 1.000 ms against the searched placement's 2.000 ms, "
    f"2.00x; the searched placement (found by the op-level search) is saved as {SEARCHED_PLACEMENT_FILE}"
)


def code_held_still(monkeypatch) -> None:
    """Collage's source is part of the key a run's end is kept under: held still for tests that rerun a
    command into the same directory, since other files of the working tree may be edited meanwhile."""
    from collage_core.outputs import reuse

    monkeypatch.setattr(reuse, "code_digest", lambda modules: "this code")


@pytest.fixture(scope="module")
def baseline_won(optimized, workspace, costs):
    """A run whose baseline (TVM's unpartitioned build) won the contest in turns, made so."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        code_held_still(monkeypatch)
        return contest_on_tvm(workspace / "baseline-won", costs, monkeypatch, "last rival")


def test_a_baseline_that_won_the_contest_is_returned_with_its_latency_in_turns_and_every_file_says_why(baseline_won, workspace, capsys):
    out = workspace / "baseline-won"
    headline = baseline_won.end_to_end[0]
    assert headline == EndToEnd(PLACEMENT, Cost.measured(1e-3, 1e-5, 20), {"tvm": 45}, True, Cost.measured(1e-3, 1e-5, 20), 1.0)
    assert baseline_won.latency() == headline.cost
    with pytest.raises(CollageError, match=r"^latency: no row called 'fastest' in this result's table \(its rows: 'placement'"):
        baseline_won.latency("fastest")
    assert [(e.name, e.timed_in_turns) for e in baseline_won.end_to_end[:4]] == [
        (PLACEMENT, True),
        (f"{SEARCHED}, {IN_TURNS}", True),
        (f"{PLACEMENT}, {ONE_AFTER_ANOTHER}", False),
        (f"{SEARCHED}, {ONE_AFTER_ANOTHER}", False),
    ]
    assert baseline_won.placement.why_chosen == BASELINE_WON
    report = (out / "report.txt").read_text().splitlines()
    assert report[1:3] == [
        "latency: 1.000 ms ±0.010 warm, back to back, timed in turns with 1 rival build; 1.000 ms ±0.010 after 1.0 s idle",
        f"why this placement: {BASELINE_WON}",
    ]
    results = json.loads((out / "results.json").read_text())
    assert results["why_chosen"] == BASELINE_WON and results["replayed_from"] is None
    assert results["end_to_end"][0] == {**headline.to_json(), "noisy": False}
    assert json.loads((out / "placement.json").read_text())["why_chosen"] == BASELINE_WON
    from collage_core.cli import main

    assert main(["show", str(out / "placement.json")]) == 0
    assert f"why this placement: {BASELINE_WON}\n" in capsys.readouterr().out


def test_the_searched_placement_that_lost_is_saved_and_replays_into_its_own_directory_measuring_nothing_else(
    baseline_won, workspace, monkeypatch, capsys
):
    """A replay builds, verifies and times its placement: no baselines, no contest, and the run whose
    file it replays is left as it was."""
    from collage_core.build import stage as build_stage
    from collage_core.outputs.placement_file import load_placement

    out = workspace / "baseline-won"
    searched = load_placement(out / SEARCHED_PLACEMENT_FILE)
    assert searched.why_chosen.startswith("found by the op-level search; not returned: unpartitioned relax.build")
    assert searched.partitions != baseline_won.placement.partitions and len(searched.partitions) > 1
    assert searched.partitions == baseline_won.searched_placement.partitions

    def must_not_run(*args, **kwargs):
        raise AssertionError("a replay measures no baselines and times no contest")

    monkeypatch.setattr(build_stage, "baselines", must_not_run)
    monkeypatch.setattr(build_stage, "contest", must_not_run)
    before = {path.name: path.stat().st_mtime_ns for path in out.iterdir()}
    replayed = collage_core.optimize(str(TINY_RESNET), placement=out / SEARCHED_PLACEMENT_FILE, backends=["tvm"], output_dir=out / "replay")
    assert {path.name: path.stat().st_mtime_ns for path in out.iterdir() if path.name != "replay"} == before
    assert replayed.placement.partitions == searched.partitions and replayed.verification.passed
    assert [(e.name, e.timed_in_turns) for e in replayed.end_to_end] == [(PLACEMENT, False)]
    assert replayed.placement.why_chosen.startswith(f"replayed from {out / SEARCHED_PLACEMENT_FILE} (the file says why")
    assert json.loads((out / "replay" / "results.json").read_text())["replayed_from"] == str(out / SEARCHED_PLACEMENT_FILE)
    assert not (out / "replay" / SEARCHED_PLACEMENT_FILE).exists() and not (out / "replay" / "finished.json").exists()
    assert "overwriting" not in capsys.readouterr().err


def test_the_cli_replays_into_collage_out_replay_and_takes_dash_o_saying_whose_files_it_overwrites(
    baseline_won, workspace, tmp_path, monkeypatch, capsys
):
    import shutil

    from collage_core.build import stage as build_stage
    from collage_core.cli import main

    def must_not_run(*args, **kwargs):
        raise AssertionError("a replay measures no baselines unless --compare")

    monkeypatch.setattr(build_stage, "baselines", must_not_run)
    monkeypatch.chdir(tmp_path)
    searched = workspace / "baseline-won" / SEARCHED_PLACEMENT_FILE
    assert main(["optimize", str(TINY_RESNET), "--placement", str(searched), "--backends", "tvm"]) == 0
    assert (tmp_path / "collage-out" / "tiny_resnet" / "replay" / "placement.json").exists()
    saved = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("saved: ")).removeprefix("saved: ").split(", ")
    assert saved[:4] == [
        f"collage-out/tiny_resnet/replay/{name}" for name in ("placement.json", "tiny_resnet.so", "report.txt", "results.json")
    ]
    assert all((tmp_path / path.split(" ")[0]).exists() for path in saved)  # every file named was written

    copy = tmp_path / "a-searched-run"
    shutil.copytree(workspace / "baseline-won", copy, ignore=shutil.ignore_patterns("replay"))
    assert main(["optimize", str(TINY_RESNET), "--placement", str(searched), "--backends", "tvm", "-o", str(copy)]) == 0
    err = capsys.readouterr().err
    assert [said(line) for line in err.splitlines() if "overwriting" in line] == [
        f"overwriting the searched run in {copy} (its placement.json, report.txt, results.json and library)"
    ]
    assert json.loads((copy / "results.json").read_text())["replayed_from"] == str(searched)


@pytest.mark.slow
def test_a_run_that_cannot_reuse_the_run_before_says_why_and_a_searched_placement_that_wins_leaves_no_stale_file(
    baseline_won, workspace, costs, tmp_path, monkeypatch, capsys
):
    """The same command into the same directory reuses the run before; a changed setting or a library
    written again since is named in one line. The searched placement winning this time, the run before's
    searched-placement.json goes."""
    import os
    import shutil

    code_held_still(monkeypatch)
    copy = tmp_path / "again"
    shutil.copytree(workspace / "baseline-won", copy, ignore=shutil.ignore_patterns("replay"))
    library = copy / "tiny_resnet.so"
    stat = library.stat()
    os.utime(library, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    touched = contest_on_tvm(copy, costs, monkeypatch, "last rival", show_progress=True)
    lines = [said(line) for line in capsys.readouterr().err.splitlines() if "is not reused" in line]
    assert lines == [
        f"the run before in {copy} is not reused: its library tiny_resnet.so was written again after it "
        "ended (by another run into the same directory?)"
    ]
    assert touched.placement.why_chosen == BASELINE_WON

    placement_won = contest_on_tvm(copy, costs, monkeypatch, "placement", show_progress=True, baseline_limit_s=30.0)
    lines = [said(line) for line in capsys.readouterr().err.splitlines() if "is not reused" in line]
    assert lines == [f"the run before in {copy} is not reused: other settings (baseline_limit_s)"]
    assert placement_won.placement.why_chosen == (
        "found by the op-level search; it won the contest in turns: 1.000 ms against unpartitioned relax.build's 2.000 ms, 2.00x"
    )
    assert placement_won.latency() == Cost.measured(1e-3, 1e-5, 20) and placement_won.searched_placement is None
    assert not (copy / SEARCHED_PLACEMENT_FILE).exists()
    why = placement_won.placement.why_chosen
    assert json.loads((copy / "results.json").read_text())["why_chosen"] == why
    assert json.loads((copy / "placement.json").read_text())["why_chosen"] == why
    assert f"why this placement: {why}" in (copy / "report.txt").read_text().splitlines()


@pytest.mark.parametrize(
    "placement_ms, rival_ms, why",
    [
        (0.631, 0.700, "found by the two-level search; it won the contest in turns: 0.631 ms against onnxruntime alone's 0.700 ms, 1.11x"),
        (
            0.631,
            0.625,
            "found by the two-level search; kept: in the contest in turns onnxruntime alone ran 0.625 ms against "
            "its 0.631 ms, within the 2% a baseline must win by",
        ),
        (
            0.631,
            0.214,
            "onnxruntime alone won the contest in turns: 0.214 ms against the searched placement's 0.631 ms, "
            f"2.95x; the searched placement (found by the two-level search) is saved as {SEARCHED_PLACEMENT_FILE}",
        ),
    ],
    ids=["the search won", "the search kept within the margin", "a baseline won"],
)
def test_why_a_placement_won_the_contest_is_said_with_the_latencies_in_turns(placement_ms, rival_ms, why):
    from collage_core.build.stage import Built, Contest, after_contest, found_by
    from collage_core.records import Partition

    def parts(backend):
        return [Partition(backend, f"{backend}.region", (0, 1), backend, Cost.unknown())]

    rival = (EndToEnd("onnxruntime alone", Cost.measured(0.4e-3, 1e-6, 5), {"onnxruntime": 2}), parts("onnxruntime"))
    turns = {
        PLACEMENT: alike_in_turns(Cost.measured(placement_ms / 1e3, 1e-6, 99)),
        "onnxruntime alone": alike_in_turns(Cost.measured(rival_ms / 1e3, 1e-6, 99)),
    }
    won = rival_ms < placement_ms * (1 - TURNS_MARGIN)
    built = Built(None, [], Cost.measured(0.3e-3, 1e-6, 5))
    contest = Contest(turns, 0, Built(None, [], Cost.measured(0.5e-3, 1e-6, 5))) if won else Contest(turns)
    outcome = after_contest(found_by("two-level"), parts("openvino"), built, [rival], [rival], contest)
    assert outcome.why == why and (outcome.replacement is not None) == won
    headline = outcome.rows[0]
    assert (headline.name, headline.cost, headline.timed_in_turns) == (
        PLACEMENT,
        turns["onnxruntime alone" if won else PLACEMENT].warm,
        True,
    )
    assert [row.timed_in_turns for row in outcome.rows] == [True, True, False, False] + [False] * won


def test_where_the_placement_came_from_starts_why_it_was_returned():
    from collage_core.build.stage import found_by

    assert found_by("op-level") == "found by the op-level search"
    assert found_by("two-level", "p.json", "") == "replayed from p.json"
    assert (
        found_by("two-level", "p.json", "found by the two-level search")
        == "replayed from p.json (the file says why it was chosen: found by the two-level search)"
    )
