"""The backend against the plugin contract on a shipped model (collage_core.kit.testing.contract_problems):
its partitions run oneDNN's code and compute what TVM does; timed beside TVM's thread pool with --run-slow."""

from pathlib import Path

import pytest

from collage_core.kit.testing import contract_problems

MODEL = Path(__file__).resolve().parents[3] / "models" / "tiny_resnet.onnx"


@pytest.mark.parametrize("timed", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_meets_the_plugin_contract(pm, timed):
    assert contract_problems(pm, "dnnl", str(MODEL), timed=timed) == []
