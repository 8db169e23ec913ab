"""collage_core.testing.contract_problems: a plugin's hooks run against the contract, one line per problem."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from collage_core import Availability, Backend, Pattern, PatternRefused, hookimpl, testing, tvm_compat
from collage_core.build.executable import packed_call_function, replace_functions
from collage_core.measure import contention
from collage_core.measure.contention import Timings
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
        testing.function_module(lambda bb, x: relax.op.nn.relu(bb.emit(relax.op.abs(x))), (2, 3)), [relu], "mine.relu"
    )
    assert candidate is None and len(graph.graph) == 2  # the relu alone does not cover the abs before it


def test_a_broken_check_is_a_problem_and_a_refusal_with_a_reason_is_not():
    pm = get_plugin_manager(extra_modules=["plugins_for_tests.refusing_checks_plugin"])
    problems = testing.contract_problems(pm, "picky", str(MODELS / "tiny_resnet.onnx"))
    assert problems[0] == "pattern picky.add: the check raised ZeroDivisionError: division by zero"
    assert not any("picky.relu" in line for line in problems)  # refused with a reason: as the contract says


def relu_plugin_manager(name: str, lower, check=None, prepares_runtime=True):
    """The installed plugins and a backend ``name`` that runs ``relax.nn.relu`` (taking what ``check``
    takes) and lowers each partition by ``lower(func, function_name)``; it answers
    ``collage_prepare_runtime`` only if ``prepares_runtime``."""
    plugin = types.SimpleNamespace()

    @hookimpl
    def collage_register_backends(register):
        register(Backend(name, OP_LEVEL, ("cpu",), "1", "for tests only"))

    @hookimpl
    def collage_check_availability(backend):
        return Availability.yes() if backend.name == name else None

    @hookimpl
    def collage_contribute_patterns(backend, target):
        return [Pattern(f"{name}.relu", is_op("relax.nn.relu")(wildcard()), check=check)] if backend.name == name else None

    @hookimpl
    def collage_lower_partitions(backend, mod, function_names, target):
        return replace_functions(mod, function_names, lower) if backend.name == name else None

    @hookimpl
    def collage_prepare_runtime(backend):
        return True if backend.name == name else None

    hooks = (collage_register_backends, collage_check_availability, collage_contribute_patterns, collage_lower_partitions)
    for hook in hooks + ((collage_prepare_runtime,) if prepares_runtime else ()):
        setattr(plugin, hook.__name__, hook)
    pm = get_plugin_manager()
    pm.register(plugin, name=name)
    return pm


def calling(packed_function: str):
    """A lowering that replaces the partition by a call of ``packed_function`` on its operand."""
    return lambda func, name: packed_call_function(func, name, packed_function, "relu", list(func.params))


def register(name: str, kernel) -> None:
    tvm_ffi.register_global_func(name, kernel, override=True)


def test_a_kernel_that_computes_something_else_is_caught_by_comparing_with_tvm():
    register("collage_test.wrong_relu", lambda spec, x, out: out.copyfrom(np.abs(x.numpy())))
    pm = relu_plugin_manager("wrongrelu", calling("collage_test.wrong_relu"), prepares_runtime=False)
    problems = testing.contract_problems(pm, "wrongrelu", str(MODELS / "tiny_resnet.onnx"), timed=False)
    assert len(problems) == 2
    assert problems[0].startswith("pattern wrongrelu.relu: computes something else than TVM on operators [")
    assert problems[1].startswith("collage_prepare_runtime answered nothing for it")


def test_a_plugin_whose_kernel_runs_and_computes_what_tvm_computes_meets_the_contract():
    register("collage_test.relu", lambda spec, x, out: out.copyfrom(np.maximum(x.numpy(), 0)))
    pm = relu_plugin_manager("goodrelu", calling("collage_test.relu"))
    assert testing.contract_problems(pm, "goodrelu", str(MODELS / "tiny_resnet.onnx"), timed=False) == []


def test_a_lowering_that_leaves_the_partition_as_it_was_is_caught():
    pm = relu_plugin_manager("idle", lambda func, name: func)
    problems = testing.contract_problems(pm, "idle", str(MODELS / "tiny_resnet.onnx"), timed=False)
    assert problems == [
        "pattern idle.relu: the lowering left the partition as it was: TVM compiles it with its own "
        "kernels and the plugin's code never runs (call a packed function the plugin registers, or "
        "give the partition a Codegen attribute)"
    ]


def rewritten(func, name, make):
    """``func`` (a partition of one operand) with its body ``make(bb, operand)``."""
    bb = relax.BlockBuilder()
    params = [relax.Var(param.name, tvm_compat.value_type(param)) for param in func.params]
    with bb.function(name, params, attrs=dict(func.attrs), private=True):
        bb.emit_func_output(bb.emit(make(bb, params[0])))
    return bb.get()[name]


def test_a_lowering_that_rewrites_the_partition_into_other_plain_relax_is_caught():
    def clipped(func, name):
        return rewritten(func, name, lambda bb, x: relax.op.clip(x, 0, 1e30))

    problems = testing.contract_problems(
        relu_plugin_manager("clipping", clipped), "clipping", str(MODELS / "tiny_resnet.onnx"), timed=False
    )
    assert problems == [f"pattern clipping.relu: the lowering left the partition plain Relax: {problems[0].split(': ', 2)[2]}"]


def test_a_packed_function_the_partition_calls_on_a_branch_never_taken_is_caught():
    register("collage_test.never_called", lambda spec, x, out: out.copyfrom(np.maximum(x.numpy(), 0)))

    def unused_call(func, name):
        def make(bb, x):
            kernel = relax.call_dps_packed("collage_test.never_called", [tvm_compat.string_expr("relu"), x], tvm_compat.value_type(x))
            return relax.If(relax.const(False, "bool"), relax.SeqExpr([], kernel), relax.SeqExpr([], relax.op.nn.relu(x)))

        return rewritten(func, name, make)

    problems = testing.contract_problems(
        relu_plugin_manager("unused", unused_call), "unused", str(MODELS / "tiny_resnet.onnx"), timed=False
    )
    assert problems == ["pattern unused.relu: the built partition never called collage_test.never_called when it ran"]


def test_checks_that_refuse_with_a_reason_of_several_lines_or_none_are_caught():
    def refuse(reason):
        def check(match):
            raise PatternRefused(reason)

        return check

    def problems(name, reason):
        pm = relu_plugin_manager(name, calling("collage_test.relu"), check=refuse(reason))
        return testing.contract_problems(pm, name, str(MODELS / "tiny_resnet.onnx"), timed=False)

    assert problems("wordy", "too large\nsee the manual") == [
        "pattern wordy.relu: its check refuses with a reason of several lines ('too large' ...); say it in one"
    ]
    assert problems("mute", "") == ["pattern mute.relu: its check refuses with an empty reason; say why"]


def test_a_lowering_that_refuses_what_its_check_took_is_named_with_the_pattern_and_its_operators():
    def refusing(func, name):
        raise ValueError("relu of rank 4 is not supported\n(see the kernel's source)")

    problems = testing.contract_problems(relu_plugin_manager("late", refusing), "late", str(MODELS / "tiny_resnet.onnx"), timed=False)
    assert len(problems) == 2
    assert problems[0].startswith("pattern late.relu: its check took operators [")
    assert "but the lowering refused them (backend late: lowering failed: " in problems[0]
    assert problems[0].endswith("refuse in the check with PatternRefused, whose reason collage inspect shows")
    assert problems[1] == (
        "pattern late.relu: the lowering's error spans several lines and Collage shows only the "
        "last; say it in one ('ValueError: relu of rank 4 is not supported' ...)"
    )


def test_contention_beside_tvms_kernel_is_a_problem_of_the_pattern(monkeypatch):
    register("collage_test.relu", lambda spec, x, out: out.copyfrom(np.maximum(x.numpy(), 0)))
    timed = []

    def made_up(run, run_tvm):
        run()
        run_tvm()
        timed.append(run)
        return Timings([0.1e-3] * 7, [5e-3] * 7)

    monkeypatch.setattr(testing, "times_beside_tvm", made_up)
    problems = testing.contract_problems(
        relu_plugin_manager("spinning", calling("collage_test.relu")), "spinning", str(MODELS / "tiny_resnet.onnx")
    )
    assert problems == [contention.contention(Timings([0.1e-3] * 7, [5e-3] * 7)).join(["pattern spinning.relu: ", ""])]
    assert len(timed) == contention.ROUNDS


def test_an_unregistered_backend_is_named_with_the_registered_ones():
    problems = testing.contract_problems(get_plugin_manager(), "nosuch", str(MODELS / "tiny_resnet.onnx"))
    assert len(problems) == 1 and problems[0].startswith("backend 'nosuch' is not registered by any plugin (registered: ")


def test_a_codegen_that_tvm_lacks_is_named_as_tvms_failure_not_as_a_refusal():
    def for_missing_codegen(func, name):
        return func.with_attrs({"Codegen": "collage_test_missing", "global_symbol": name})

    problems = testing.contract_problems(
        relu_plugin_manager("nocodegen", for_missing_codegen), "nocodegen", str(MODELS / "tiny_resnet.onnx"), timed=False
    )
    assert problems == [
        "pattern nocodegen.relu: TVM's codegen failed on what the lowering returned: InternalError: Check "
        "failed: (codegen.has_value()) is false: Codegen is not found: relax.ext.collage_test_missing"
    ]
