"""collage_core.testing.contract_problems: a plugin's hooks run against the contract, one line per problem."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
from tvm.relax.dpl import is_op, wildcard

from collage_core import Availability, Backend, Pattern, hookimpl, testing
from collage_core.build.executable import packed_call_function, replace_functions
from collage_core.plugins import get_plugin_manager
from collage_core.records import OP_LEVEL

MODELS = Path(__file__).resolve().parents[1] / "models"


def test_whole_candidate_names_the_graph_and_the_candidate_covering_every_operator():
    from tvm import relax

    relu = Pattern("mine.relu", is_op("relax.nn.relu")(wildcard()))
    alone = testing.whole_candidate(testing.function_module(lambda bb, x: relax.op.nn.relu(x), (2, 3)), [relu], "mine.relu")
    assert (alone.candidate.backend, alone.candidate.pattern, set(alone.candidate.nodes)) == ("mine", "mine.relu", {0})
    assert len(alone.graph.graph) == 1
    graph, candidate = testing.whole_candidate(
        testing.function_module(lambda bb, x: relax.op.nn.relu(bb.emit(relax.op.abs(x))), (2, 3)), [relu], "mine.relu")
    assert candidate is None and len(graph.graph) == 2  # the relu alone does not cover the abs before it


def test_a_broken_check_is_a_problem_and_a_refusal_with_a_reason_is_not():
    pm = get_plugin_manager(extra_modules=["plugins_for_tests.refusing_checks_plugin"])
    problems = testing.contract_problems(pm, "picky", str(MODELS / "tiny_resnet.onnx"))
    assert problems[0] == "pattern picky.add: the check raised ZeroDivisionError: division by zero"
    assert not any("picky.relu" in line for line in problems)  # refused with a reason: as the contract says


def test_a_kernel_that_computes_something_else_is_caught_by_comparing_with_tvm():
    import tvm_ffi

    tvm_ffi.register_global_func("collage_test.wrong_relu", lambda spec, x, out: out.copyfrom(np.abs(x.numpy())),
                                 override=True)
    plugin = types.SimpleNamespace()

    @hookimpl
    def collage_register_backends(register):
        register(Backend("wrongrelu", OP_LEVEL, ("cpu",), "1", "abs, not relu, for tests only"))

    @hookimpl
    def collage_check_availability(backend):
        return Availability.yes() if backend.name == "wrongrelu" else None

    @hookimpl
    def collage_contribute_patterns(backend, target):
        return [Pattern("wrongrelu.relu", is_op("relax.nn.relu")(wildcard()))] if backend.name == "wrongrelu" else None

    @hookimpl
    def collage_lower_partitions(backend, mod, function_names, target):
        if backend.name != "wrongrelu":
            return None
        return replace_functions(mod, function_names, lambda func, name: packed_call_function(
            func, name, "collage_test.wrong_relu", "relu", list(func.params)))

    for hook in (collage_register_backends, collage_check_availability, collage_contribute_patterns,
                 collage_lower_partitions):
        setattr(plugin, hook.__name__, hook)
    pm = get_plugin_manager()
    pm.register(plugin, name="wrongrelu")
    problems = testing.contract_problems(pm, "wrongrelu", str(MODELS / "tiny_resnet.onnx"))
    assert problems[0].startswith("pattern wrongrelu.relu: computes something else than TVM on operators [")
    assert problems[-1].startswith("collage_prepare_runtime answered nothing for it")


def test_an_unregistered_backend_is_named_with_the_registered_ones():
    problems = testing.contract_problems(get_plugin_manager(), "nosuch", str(MODELS / "tiny_resnet.onnx"))
    assert len(problems) == 1 and problems[0].startswith("backend 'nosuch' is not registered by any plugin (registered: ")
