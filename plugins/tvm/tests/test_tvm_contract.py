"""TVM's own backend against the plugin contract on a shipped model (collage_core.kit.testing.contract_problems):
its partitions stay Relax for TVM to compile, as it says (collage_runtime_libraries answers []), and build and
compute what TVM does; timed beside TVM's thread pool with --run-slow."""

from pathlib import Path

import pytest

from collage_core.kit.testing import contract_problems

MODEL = Path(__file__).resolve().parents[3] / "models" / "tiny_bert.onnx"


@pytest.mark.parametrize("timed", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_meets_the_plugin_contract(pm, timed):
    assert contract_problems(pm, "tvm", str(MODEL), timed=timed) == []
