"""The tuning stage (``--tune-budget-s``): the placement's costliest partitions handed to ``collage_tune_partitions``,
then the search again with what was tuned. The backend that tunes here is a deterministic test double
(``plugins_for_tests.tuning_double``); MetaSchedule's own tuning is tested in plugins/metaschedule/tests."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tvm import relax

import collage_core
from collage_core.records import Cost, Partition
from collage_core.search import tuning_stage


def small_model():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((32, 64), "float32"))
    w = relax.Var("w", relax.TensorType((64, 64), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            product = bb.emit(relax.op.matmul(x, w))
            activated = bb.emit(relax.op.nn.relu(product))
            output = bb.emit_output(relax.op.add(activated, x))
        bb.emit_func_output(output)
    return bb.get()


class FakeJob:
    """What ``costliest`` reads of a job: the backends' kinds."""

    def __init__(self, backends):
        self.backends = backends


def test_costliest_orders_the_measured_op_level_partitions_by_share():
    from collage_core.records import GRAPH_LEVEL, OP_LEVEL, Backend

    backends = {"tvm": Backend("tvm", OP_LEVEL, ("cpu",), "1"), "engine": Backend("engine", GRAPH_LEVEL, ("cpu",), "1")}
    parts = [
        Partition("tvm", "tvm.op", (0,), "a", Cost.measured(1e-3, 0, 3)),
        Partition("engine", "engine.region", (1,), "b", Cost.measured(9e-3, 0, 3)),
        Partition("tvm", "tvm.op", (2,), "c", Cost.measured(3e-3, 0, 3)),
        Partition("tvm", "tvm.op", (3,), "d", Cost.invalid("did not build")),
    ]
    assert tuning_stage.costliest(FakeJob(backends), parts) == [("collage_tvm_2", 0.75), ("collage_tvm_0", 0.25)]


@pytest.fixture
def tuning_double(load_test_plugin, monkeypatch, tmp_path):
    from collage_core import optimizer
    from collage_core.build import deploy

    monkeypatch.setenv("TUNING_DOUBLE_DIR", str(tmp_path))
    pm, _ = load_test_plugin("plugins_for_tests.tuning_double")
    # The search's and the runtime's (a placement that gives the tuned operators to tuning-double runs on it).
    monkeypatch.setattr(optimizer, "get_plugin_manager", lambda: pm)
    monkeypatch.setattr(deploy, "get_plugin_manager", lambda: pm)
    from plugins_for_tests import tuning_double

    return tuning_double


def test_collage_tune_partitions_gets_the_costliest_partitions_and_the_search_runs_again_with_what_was_tuned(tuning_double, tmp_path):
    common = dict(
        backends=["tvm", tuning_double.BACKEND],
        search="op-level",
        cost_db=tmp_path / "costs.sqlite",
        compare_backends=False,
        calibration_rounds=0,
        show_progress=False,
    )
    untuned = collage_core.optimize(small_model(), **common)
    assert tuning_double.BACKEND not in untuned.end_to_end[0].operators_by_backend
    assert not (tmp_path / "tuned.json").exists()

    tuned = collage_core.optimize(small_model(), tune_budget_s=5, **common)
    state = json.loads((tmp_path / "tuned.json").read_text())
    # The first search of the tuned run found the untuned run's placement and handed over its partitions (their
    # order by share is test_costliest_orders_the_measured_op_level_partitions_by_share's: costs measured again
    # on a busy machine may reorder near ties here).
    parts = untuned.placement.partitions
    assert sorted(state["handed"]) == sorted(f"collage_tvm_{index}" for index in range(len(parts)))
    assert state["tuned_ops"]
    # The second search saw the tuned operators' candidates beside TVM's.
    assert tuned.candidates > untuned.candidates
    assert "tuning" in tuned.phases_s
    # A Relax module has no reference to verify against: its outputs are checked here.
    x, w = np.random.default_rng(0).standard_normal((32, 64), "float32"), np.random.default_rng(1).standard_normal((64, 64), "float32")
    np.testing.assert_allclose(tuned.run(x, w)[0], np.maximum(x @ w, 0) + x, rtol=1e-4, atol=1e-4)


def test_without_a_tuning_budget_no_backend_is_asked_to_tune(tuning_double, tmp_path):
    collage_core.optimize(
        small_model(),
        backends=["tvm", tuning_double.BACKEND],
        search="op-level",
        cost_db=tmp_path / "costs.sqlite",
        compare_backends=False,
        calibration_rounds=0,
        show_progress=False,
    )
    assert not (tmp_path / "tuned.json").exists()


def test_a_tuning_budget_without_a_backend_that_tunes_says_so_and_keeps_the_placement(tuning_double, tmp_path, capsys):
    result = collage_core.optimize(
        small_model(),
        backends=["tvm"],
        search="op-level",
        cost_db=tmp_path / "costs.sqlite",
        compare_backends=False,
        calibration_rounds=0,
        tune_budget_s=5,
    )
    assert "no selected backend tunes kernels" in capsys.readouterr().err
    assert result.end_to_end[0].operators_by_backend == {"tvm": 3}
    assert not (tmp_path / "tuned.json").exists()
