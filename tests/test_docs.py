"""docs/plugins.md against the hook specs and the tests, and its example plugin run for real."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import types
from pathlib import Path

import numpy as np
import pytest
import tvm
from signatures import signature_text
from tvm import relax

from collage_core import hookspecs, tvm_compat
from collage_core.backends import contribute_patterns, discover_backends, select_backends
from collage_core.build.executable import build, partitions_by_backend
from collage_core.build.partition import partition_module
from collage_core.candidates.enumeration import enumerate_candidates
from collage_core.model.relax_graph import RelaxGraph
from collage_core.plugins import get_plugin_manager

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "plugins.md"
# "## name(arguments) -> returned": a hook's heading, its signature typed as the spec is
HOOK_HEADING = re.compile(r"^## (\w+)(\(.*)$", re.MULTILINE)
# matmul with an inner dimension of 8 in float32: a handful of roundings per element.
RTOL, ATOL = 1e-5, 1e-6


def hook_specs() -> dict[str, str]:
    """Each hook spec's signature, as the docs write it."""
    return {
        name: signature_text(function)
        for name, function in inspect.getmembers(hookspecs, inspect.isfunction)
        if name.startswith(f"{hookspecs.PROJECT}_")
    }


def documented_hooks() -> dict[str, str]:
    return {name: signature.rstrip() for name, signature in HOOK_HEADING.findall(DOCS.read_text())}


def example_plugin_source(index: int = 0) -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", DOCS.read_text(), re.MULTILINE | re.DOTALL)
    assert len(blocks) == 2, "docs/plugins.md should hold exactly two python blocks: the two example plugins"
    return blocks[index]


def example_plugin(index: int, name: str):
    module = types.ModuleType(f"collage_{name}.hooks")
    exec(compile(example_plugin_source(index), f"{DOCS}:{name}", "exec"), module.__dict__)
    pm = get_plugin_manager(load_entry_points=True)
    pm.register(module, name=name)
    pm.check_pending()
    return pm


def test_hook_specs_are_found():
    assert set(hook_specs()) >= {"collage_register_backends", "collage_lower_partitions"}


@pytest.mark.parametrize("hook", sorted(hook_specs()))
def test_every_hook_has_a_heading_with_its_signature(hook):
    documented = documented_hooks()
    assert hook in documented, f"docs/plugins.md has no '## {hook}(...)' heading"
    assert documented[hook] == hook_specs()[hook]


def test_no_heading_names_a_hook_that_does_not_exist():
    assert set(documented_hooks()) - set(hook_specs()) == set()


@pytest.mark.parametrize("hook", sorted(hook_specs()))
def test_every_hook_has_a_test(hook):
    test_names = set()
    for path in Path(__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                test_names.add(node.name)
    assert any(hook in name for name in test_names), f"no test function in tests/*.py names {hook}"


def matmul_relu_add(dtype: str) -> tvm.IRModule:
    """``relu(x @ w) + b``: three operators, so a placement can put the middle one elsewhere."""
    x = relax.Var("x", relax.TensorType((4, 8), dtype))
    w = relax.Var("w", relax.TensorType((8, 16), dtype))
    b = relax.Var("b", relax.TensorType((4, 16), dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            product = bb.emit(relax.op.matmul(x, w))
            rectified = bb.emit(relax.op.nn.relu(product))
            output = bb.emit_output(relax.op.add(rectified, b))
        bb.emit_func_output(output)
    return bb.get()


@pytest.fixture(scope="module")
def example_pm():
    return example_plugin(0, "example")


@pytest.fixture(scope="module")
def numpydense_pm():
    return example_plugin(1, "numpydense")


def test_example_plugin_registers_an_available_backend(example_pm):
    infos = discover_backends(example_pm)
    assert infos["example"].plugin == "example"
    assert infos["example"].availability.available, infos["example"].availability.reason
    assert [info.name for info in select_backends(infos, ["example", "tvm"])] == ["example", "tvm"]


def test_example_plugin_contributes_a_float32_relu_pattern(example_pm):
    infos = discover_backends(example_pm)
    patterns = contribute_patterns(example_pm, infos["example"].backend, tvm_compat.host_cpu_target())
    assert [pattern.name for pattern in patterns] == ["example.relu"]
    for dtype, expected in (("float32", [frozenset({1})]), ("float16", [])):
        graph = RelaxGraph.from_function(matmul_relu_add(dtype)["main"])
        assert [c.nodes for c in enumerate_candidates(graph, patterns)] == expected, dtype


def test_example_plugin_builds_and_runs_relu_between_tvm_partitions(example_pm):
    target = tvm_compat.host_cpu_target()
    infos = discover_backends(example_pm)
    mod = matmul_relu_add("float32")
    graph = RelaxGraph.from_function(mod["main"])
    patterns = [p for name in ("example", "tvm") for p in contribute_patterns(example_pm, infos[name].backend, target)]
    candidates = enumerate_candidates(graph, patterns)
    wanted = {1: ("example", "example.relu"), 0: ("tvm", "tvm.op"), 2: ("tvm", "tvm.op")}
    parts = [
        next(c for c in candidates if c.nodes == {node} and (c.backend, c.pattern) == chosen) for node, chosen in sorted(wanted.items())
    ]
    placed = partition_module(graph, parts)
    assert {backend: len(names) for backend, names in partitions_by_backend(placed).items()} == {"example": 1, "tvm": 2}

    executable = build(example_pm, placed, {name: info.backend for name, info in infos.items()}, target)
    device = tvm_compat.device_for(target)
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(-1, 1, size=shape).astype("float32") for shape in ((4, 8), (8, 16), (4, 16))]
    vm = relax.VirtualMachine(executable, device)
    result = tvm_compat.to_numpy(vm["main"](*[tvm_compat.to_tensor(a, device) for a in inputs]))
    x, w, b = inputs
    np.testing.assert_allclose(result, np.maximum(x @ w, 0) + b, rtol=RTOL, atol=ATOL)


def test_second_example_runs_a_matmul_through_its_registered_kernel_as_tvm_computes_it(numpydense_pm):
    from collage_core import testing

    target = tvm_compat.host_cpu_target()
    infos = discover_backends(numpydense_pm)
    assert infos["numpydense"].availability.available
    patterns = contribute_patterns(numpydense_pm, infos["numpydense"].backend, target)
    mod = testing.function_module(lambda bb, x, w: bb.emit(relax.op.matmul(x, w)), (4, 8), (8, 16))
    found = testing.whole_candidate(mod, patterns, "numpydense.matmul")
    assert found.candidate is not None
    placed = partition_module(found.graph, [found.candidate])
    executable = build(numpydense_pm, placed, {"numpydense": infos["numpydense"].backend}, target)
    assert "collage_numpydense.matmul" in executable.as_text()
    rng = np.random.default_rng(1)
    inputs = [rng.uniform(-1, 1, size=shape).astype("float32") for shape in ((4, 8), (8, 16))]
    device = tvm_compat.device_for(target)
    vm = relax.VirtualMachine(executable, device)
    result = tvm_compat.to_numpy(vm["main"](*[tvm_compat.to_tensor(a, device) for a in inputs]))
    np.testing.assert_allclose(result, testing.run_on_cpu(mod, inputs), rtol=RTOL, atol=ATOL)


def test_second_example_takes_weights_as_constants_and_inspect_shows_its_refusals(numpydense_pm, monkeypatch):
    from collage_core import inspection

    monkeypatch.setattr(inspection, "get_plugin_manager", lambda: numpydense_pm)
    weight = relax.const(np.arange(8 * 16, dtype="float32").reshape(8, 16) / 100)
    takes = inspection.inspect_model(relax_module(lambda bb, x: bb.emit(relax.op.matmul(x, weight)), (4, 8)), backends=["numpydense"])
    assert [c.pattern for c in takes.views[0].candidates] == ["numpydense.matmul"]
    half = inspection.inspect_model(
        relax_module(lambda bb, x, w: bb.emit(relax.op.matmul(x, w)), (4, 8), (8, 16), dtype="float16"), backends=["numpydense"]
    )
    assert not half.views[0].candidates
    assert [r.reason for r in half.views[0].refusals] == ["NumPy's matmul here takes 2-D float32 tensors, not float16 of rank 2"]


def test_second_example_places_a_constant_weight_matmul_between_tvm_partitions(numpydense_pm):
    from collage_core import testing

    target = tvm_compat.host_cpu_target()
    infos = discover_backends(numpydense_pm)
    weight = np.random.default_rng(2).uniform(-1, 1, size=(8, 16)).astype("float32")
    mod = testing.function_module(
        lambda bb, x: bb.emit(relax.op.nn.relu(bb.emit(relax.op.matmul(bb.emit(relax.op.nn.relu(x)), relax.const(weight))))), (4, 8)
    )
    graph = RelaxGraph.from_function(mod["main"])
    patterns = [p for name in ("numpydense", "tvm") for p in contribute_patterns(numpydense_pm, infos[name].backend, target)]
    candidates = enumerate_candidates(graph, patterns)
    wanted = {0: "tvm.op", 1: "numpydense.matmul", 2: "tvm.op"}
    parts = [next(c for c in candidates if c.nodes == {node} and c.pattern == pattern) for node, pattern in wanted.items()]
    executable = build(numpydense_pm, partition_module(graph, parts), {n: i.backend for n, i in infos.items()}, target)
    x = np.random.default_rng(3).uniform(-1, 1, size=(4, 8)).astype("float32")
    device = tvm_compat.device_for(target)
    result = tvm_compat.to_numpy(relax.VirtualMachine(executable, device)["main"](tvm_compat.to_tensor(x, device)))
    np.testing.assert_allclose(result, np.maximum(np.maximum(x, 0) @ weight, 0), rtol=RTOL, atol=ATOL)


def relax_module(make, *shapes, dtype="float32"):
    from collage_core import testing

    return testing.function_module(make, *shapes, dtype=dtype)


def test_every_tvm_compat_helper_is_named_in_the_docs():
    text = DOCS.read_text()
    helpers = [
        name
        for name, function in inspect.getmembers(tvm_compat, inspect.isfunction)
        if not name.startswith("_") and function.__module__ == tvm_compat.__name__
    ]
    assert [name for name in helpers if f"`{name}" not in text] == []


def test_second_example_meets_the_plugin_contract_on_a_shipped_model(numpydense_pm):
    from collage_core import testing

    assert testing.contract_problems(numpydense_pm, "numpydense", str(ROOT / "models" / "tiny_bert.onnx")) == []


def kit_section() -> str:
    text = DOCS.read_text()
    start = text.index("## The kit: what a plugin imports")
    return text[start : text.index("\n## ", start + 1)]


@pytest.mark.parametrize("module_name", ["collage_core.kit", "collage_core.kit.testing"])
def test_every_name_of_the_kit_is_listed_in_the_docs(module_name):
    module = importlib.import_module(module_name)
    section = kit_section()
    assert f"`{module_name}`" in section
    assert [name for name in module.__all__ if not re.search(rf"`{name}[`(]", section)] == []


def test_every_name_the_docs_list_for_the_kit_is_in_it():
    from collage_core import kit
    from collage_core.kit import testing
    from collage_core.kit.testing import benchmarks, operator_cases, placement_cases

    listed = set(re.findall(r"^- [^:]+:(.*?)(?=^- |^\S|\Z)", kit_section(), re.MULTILINE | re.DOTALL))
    names = {name for item in listed for name in re.findall(r"`(\w+)(?:\(|`)", item)}
    cases = {"operator_cases", *vars(operator_cases), "placement_cases", *vars(placement_cases), *vars(benchmarks)}
    known = set(kit.__all__) | set(testing.__all__) | cases | {"collage_core"}
    assert sorted(names - known) == []


@pytest.mark.parametrize("index", [0, 1])
def test_the_example_plugins_import_the_kit_alone(index):
    imported = {
        node.module
        for node in ast.walk(ast.parse(example_plugin_source(index)))
        if isinstance(node, ast.ImportFrom) and node.module.startswith("collage_core")
    }
    assert imported == {"collage_core.kit"}
