"""Fixtures shared by the modules under tests/."""

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def shared_cost_db(tmp_path_factory) -> Path:
    """One cost database for the optimizations of the shipped models in test_mlf, test_optimize and
    test_show: like a user's default database, it is shared by their optimizations, so a candidate
    one of them measured is read by the next, not measured again. Tests of measuring into an empty
    or a warm database make their own (tests/reliability/, the warm-database test). Under pytest-xdist
    (``-n 2``) the workers share it too: it lies in the folder above their own temporary folders, which is
    this run's."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        folder = tmp_path_factory.getbasetemp().parent / "shared-costs"
        folder.mkdir(exist_ok=True)
        return folder / "costs.sqlite"
    return tmp_path_factory.mktemp("shared-costs") / "costs.sqlite"


@pytest.fixture
def tvm_only_run(tmp_path) -> dict:
    """The options of a quick whole optimize: TVM alone, its op-level search, no calibration, no baselines, quiet,
    its costs in the test's own database (for tests of what a run carries, such as its precision or layout)."""
    return dict(
        backends=["tvm"],
        search="op-level",
        cost_db=tmp_path / "costs.sqlite",
        compare_backends=False,
        show_progress=False,
        calibration_rounds=0,
    )


@pytest.fixture(scope="module")
def tiny_bert_on_tvm(tmp_path_factory):
    """tiny BERT placed op-level on TVM without measuring and replayed (built, verified, run end to end once), with
    the folder its placement file is in: a built model with an integer input, for tests of what its run takes."""
    from test_mlf import op_level, placement_file, replayed

    model = Path(__file__).resolve().parents[1] / "models" / "tiny_bert.onnx"
    folder = tmp_path_factory.mktemp("bert")
    return replayed(placement_file(folder / "placement.json", op_level("tvm", "tvm"), model=model), model=model), folder


@pytest.fixture
def runtime_only_env() -> dict:
    """The environment of a process with TVM's runtime alone (no compiler) and no C++ compiler either."""
    from runtime_only import environment

    return environment()


@pytest.fixture
def load_test_plugin(monkeypatch):
    """Loads a plugin of tests/plugins_for_tests by module name, here and (through PYTHONPATH) in the
    measurement workers; gives the plugin manager and every backend by name."""
    import os

    from collage_core.backends import discover_backends
    from collage_core.plugins import get_plugin_manager

    tests = str(Path(__file__).resolve().parent)
    monkeypatch.syspath_prepend(tests)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])))

    def load(module: str):
        pm = get_plugin_manager(disabled=(), extra_modules=[module])
        assert not pm.failures
        return pm, {name: info.backend for name, info in discover_backends(pm).items()}

    return load
