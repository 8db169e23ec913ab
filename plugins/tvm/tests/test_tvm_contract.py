"""TVM's own backend against the plugin contract on a shipped model (collage_core.kit.testing.contract_problems):
its partitions stay Relax for TVM to compile, as it says (collage_runtime_libraries answers []), and build and
compute what TVM does; timed beside TVM's thread pool with --run-slow."""

from pathlib import Path

import numpy as np
import pytest
from collage_tvm.hooks import patterns
from tvm import relax

from collage_core.kit.testing import contract_problems, function_module, whole_candidate

MODEL = Path(__file__).resolve().parents[3] / "models" / "tiny_bert.onnx"


@pytest.mark.parametrize("timed", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_meets_the_plugin_contract(pm, timed):
    assert contract_problems(pm, "tvm", str(MODEL), timed=timed) == []


def _norm_then_cast(bb, x):
    """GPT-2's layer norm at bf16: the norm in float32, a reshape to the product's rows, a cast to 16 bits."""
    gamma = relax.const(np.linspace(0.5, 1.5, 8, dtype="float32"))
    beta = relax.const(np.linspace(-0.25, 0.25, 8, dtype="float32"))
    normed = bb.emit(relax.op.nn.layer_norm(x, gamma, beta, axes=[-1]))
    rows = bb.emit(relax.op.reshape(normed, (8, 8)))
    return relax.op.astype(rows, "bfloat16")


def _softmax_then_cast(bb, x):
    return relax.op.astype(bb.emit(relax.op.nn.softmax(x, axis=-1)), "bfloat16")


@pytest.mark.parametrize(
    "make, pattern_name", [(_norm_then_cast, "tvm.layer_norm_elementwise2"), (_softmax_then_cast, "tvm.softmax_elementwise1")]
)
def test_a_norm_and_the_cast_after_it_are_one_candidate_that_computes_what_tvm_does(pm, make, pattern_name):
    """At bf16, GPT-2's 24 casts after its layer norms took 68 us of 1535 on an H100, each a kernel of its own:
    with the cast (and a reshape between) the norm is one partition, for FuseOps to make one kernel of."""
    mod = function_module(make, (2, 4, 8))
    found = whole_candidate(mod, patterns(None, "fp32"), pattern_name)
    assert found.candidate is not None, f"{pattern_name} does not cover the norm and its cast"
    assert contract_problems(pm, "tvm", mod, limit=64, timed=False) == []
