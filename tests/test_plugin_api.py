"""The plugin API: plugins import ``collage_core.kit`` alone; ``hookimpl_for`` declares hooks for one backend,
``backend_hooks`` every hook of a backend, and ``native_kernel_hooks`` and ``engine_hooks`` (through it) every hook
of a native-kernel backend or of a graph-level engine."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import types
from pathlib import Path

import pluggy
import pytest

import collage_core
from collage_core import hookspecs, kit
from collage_core.kit import testing as kit_testing
from collage_core.kit import tvm_compat
from collage_core.records import OP_LEVEL, Availability, Backend

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ROOT / "plugins"
# What any plugin file may import of the core, and what its tests and benchmarks may import besides.
PLUGIN_MODULES = {"collage_core", "collage_core.kit"}
TESTING = "collage_core.kit.testing"


def plugin_files() -> list[Path]:
    return sorted(path for path in PLUGINS.rglob("*.py") if ".egg-info" not in str(path))


def is_test_or_benchmark(path: Path, plugins: Path = PLUGINS) -> bool:
    return bool({"tests", "benchmarks"} & set(path.relative_to(plugins).parts))


def core_imports(source: str) -> list[tuple[int, str]]:
    """Every import of the core in ``source``, at any depth (inside functions too), and in the code a
    string holds when it parses as Python (a benchmark's child process): (line, what it imports)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "collage_core"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "collage_core":
            if node.module == "collage_core":
                found += [(node.lineno, f"collage_core.{alias.name}") for alias in node.names if alias.name not in collage_core.__all__]
            else:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "collage_core" in node.value:
            try:
                found += [(node.lineno + line - 1, name) for line, name in core_imports(node.value)]
            except SyntaxError:
                pass
    return found


def forbidden_imports(path: Path, plugins: Path = PLUGINS) -> list[str]:
    def allowed(name: str) -> bool:
        testing = name == TESTING or name.startswith(f"{TESTING}.")
        return name in PLUGIN_MODULES or (testing and is_test_or_benchmark(path, plugins))

    return [f"{path.relative_to(plugins)}:{line} imports {name}" for line, name in core_imports(path.read_text()) if not allowed(name)]


def test_plugins_are_found():
    names = {path.relative_to(PLUGINS).parts[0] for path in plugin_files()}
    assert {"tvm", "dnnl", "onnxruntime", "openvino", "cublas", "cudnn", "cutlass", "inductor"} <= names


def test_plugins_import_nothing_of_the_core_but_the_kit():
    assert [problem for path in plugin_files() for problem in forbidden_imports(path)] == []


def test_the_check_sees_imports_inside_functions_strings_and_from_the_package():
    source = '''
import collage_core
from collage_core import Backend, tvm_compat
from collage_core.kit import hookimpl_for

def late():
    from collage_core.build.executable import build

CHILD = """
from collage_core.plugins import get_plugin_manager
"""
'''
    assert [name for _, name in core_imports(source)] == [
        "collage_core",
        "collage_core.tvm_compat",
        "collage_core.kit",
        "collage_core.build.executable",
        "collage_core.plugins",
    ]


def test_only_tests_and_benchmarks_may_import_the_testing_helpers():
    assert is_test_or_benchmark(PLUGINS / "dnnl" / "tests" / "conftest.py")
    assert is_test_or_benchmark(PLUGINS / "dnnl" / "benchmarks" / "call_overhead.py")
    assert not is_test_or_benchmark(PLUGINS / "dnnl" / "collage_dnnl" / "hooks.py")


@pytest.mark.parametrize("module", [kit, kit_testing])
def test_every_name_of_the_kit_resolves(module):
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        module.nothing_here


def test_the_typed_hook_specs_load_without_tvm_or_the_records():
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, collage_core.hookspecs; print(sorted({'tvm', 'collage_core.records'} & set(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == "[]"


def test_plugin_code_may_not_import_the_testing_helpers(tmp_path):
    hooks = tmp_path / "plugins" / "mine" / "collage_mine" / "hooks.py"
    hooks.parent.mkdir(parents=True)
    hooks.write_text("from collage_core.kit.testing import build\n")
    assert forbidden_imports(hooks, tmp_path / "plugins") == ["mine/collage_mine/hooks.py:1 imports collage_core.kit.testing"]


def test_the_case_modules_hold_what_the_core_defines():
    from collage_core.relax_onnx import operator_cases, placement_cases

    for name in ("operator_cases", "placement_cases"):
        ours = importlib.import_module(f"collage_core.kit.testing.{name}")
        theirs = {"operator_cases": operator_cases, "placement_cases": placement_cases}[name]
        public = [n for n in vars(theirs) if not n.startswith("_")]
        assert all(getattr(ours, n) is getattr(theirs, n) for n in public)


def test_no_plugin_hook_tests_its_own_backend_name():
    repeating = [
        str(path.relative_to(ROOT)) for path in PLUGINS.glob("*/collage_*/hooks.py") if "backend.name != BACKEND" in path.read_text()
    ]
    assert repeating == []


# hookimpl_for


def declared_plugin(**options):
    plugin = types.SimpleNamespace(seen=[])

    @hookspecs.hookimpl
    def collage_register_backends(register):
        register(Backend("mine", OP_LEVEL, ("cpu",), "1"))

    @kit.hookimpl_for("mine", **options)
    def collage_check_availability(backend):
        plugin.seen.append(backend.name)
        return Availability.no("declared")

    @kit.hookimpl_for("mine")
    def collage_contribute_patterns(backend, target):
        return ["a pattern of " + str(target)]

    plugin.collage_register_backends = collage_register_backends
    plugin.collage_check_availability = collage_check_availability
    plugin.collage_contribute_patterns = collage_contribute_patterns
    return plugin


def manager(*plugins):
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for plugin in plugins:
        pm.register(plugin)
    pm.check_pending()
    return pm


def test_hookimpl_for_answers_for_its_backend_and_returns_none_for_the_others():
    plugin = declared_plugin()
    pm = manager(plugin)
    mine, theirs = Backend("mine", OP_LEVEL, ("cpu",), "1"), Backend("theirs", OP_LEVEL, ("cpu",), "1")
    assert pm.hook.collage_check_availability(backend=mine) == Availability.no("declared")
    assert pm.hook.collage_check_availability(backend=theirs) is None
    assert plugin.seen == ["mine"], "the function runs for its own backend only"
    # pluggy passes only the arguments the function names: it reads them through __wrapped__.
    assert pm.hook.collage_contribute_patterns(backend=mine, target="llvm", precision="fp32") == [["a pattern of llvm"]]
    assert pm.hook.collage_contribute_patterns(backend=theirs, target="llvm", precision="fp32") == []
    assert plugin.collage_contribute_patterns.__name__ == "collage_contribute_patterns"
    assert plugin.collage_contribute_patterns.collage_backend == "mine"


def test_hookimpl_for_passes_hookimpl_options_on():
    first, last = declared_plugin(), declared_plugin(trylast=True)
    pm = manager(first, last)
    options = [(impl.plugin is last, impl.trylast) for impl in pm.hook.collage_check_availability.get_hookimpls()]
    assert sorted(options) == [(False, False), (True, True)]


def test_hookimpl_for_refuses_a_hook_without_a_backend_argument():
    with pytest.raises(TypeError, match="takes no backend argument: mark it with hookimpl"):
        kit.hookimpl_for("mine")(lambda register: None)


def test_hookimpl_for_takes_the_backend_by_keyword_too():
    @kit.hookimpl_for("mine")
    def collage_prepare_runtime(backend):
        return True

    assert collage_prepare_runtime(backend=Backend("mine", OP_LEVEL, ("cpu",), "1")) is True
    assert collage_prepare_runtime(Backend("theirs", OP_LEVEL, ("cpu",), "1")) is None


# backend_hooks


class Missing(RuntimeError):
    pass


def target_of(kind: str):
    return types.SimpleNamespace(kind=types.SimpleNamespace(name=kind))


def backend_plugin(**optional):
    """A backend ``mine`` declared with ``backend_hooks`` on LLVM targets, with the ``optional`` hooks given;
    the plugin's ``calls`` lists what the declaration was asked."""
    calls = []

    def missing():
        calls.append("missing")
        return None

    def lowering(mod, function_names, target):
        calls.append(("lowering", list(function_names), target.kind.name))
        return lambda func, name: func.with_attr("lowered_as", name)

    declared = kit.backend_hooks(
        "mine",
        describe=lambda: Backend("mine", OP_LEVEL, ("cpu",), "1"),
        missing=missing,
        target_kinds=("llvm",),
        patterns=lambda target, precision: [f"a pattern on {target.kind.name} at {precision}"],
        lowering=lowering,
        prepare_runtime=lambda: calls.append("prepared"),
        **optional,
    )
    return types.SimpleNamespace(calls=calls, declared=declared, **declared.hookimpls())


def test_backend_hooks_answer_for_their_backend_alone():
    plugin = backend_plugin(
        runtime_libraries=lambda: [Path("/kernels/libmine.so")],
        lower_whole_model=lambda model, model_format, func, name, target: (model, model_format, name),
    )
    pm = manager(plugin)
    registered = []
    pm.hook.collage_register_backends(register=registered.append)
    (mine,) = registered
    theirs = Backend("theirs", OP_LEVEL, ("cpu",), "1")
    llvm = target_of("llvm")
    assert pm.hook.collage_check_availability(backend=mine) == Availability.yes()
    assert pm.hook.collage_contribute_patterns(backend=mine, target=llvm, precision="bf16") == [["a pattern on llvm at bf16"]]
    mod = partitions_module()
    lowered = pm.hook.collage_lower_partitions(backend=mine, mod=mod, function_names=["part"], target=llvm)
    assert lowered["part"].attrs["lowered_as"] == "part" and "lowered_as" not in lowered["other"].attrs
    assert pm.hook.collage_prepare_runtime(backend=mine) is True
    assert pm.hook.collage_runtime_libraries(backend=mine) == [Path("/kernels/libmine.so")]
    whole = dict(model=b"model bytes", model_format="onnx", func=mod["part"], name="main", target=llvm)
    assert pm.hook.collage_lower_whole_model(backend=mine, **whole) == (b"model bytes", "onnx", "main")
    assert plugin.calls == ["missing", ("lowering", ["part"], "llvm"), "prepared"]
    for hook in ("collage_check_availability", "collage_prepare_runtime", "collage_runtime_libraries"):
        assert getattr(pm.hook, hook)(backend=theirs) is None
    assert pm.hook.collage_contribute_patterns(backend=theirs, target=llvm, precision="fp32") == []
    assert pm.hook.collage_lower_partitions(backend=theirs, mod=mod, function_names=["part"], target=llvm) is None
    assert pm.hook.collage_lower_whole_model(backend=theirs, **whole) is None
    assert plugin.calls == ["missing", ("lowering", ["part"], "llvm"), "prepared"], "nothing is asked for another backend"


def test_backend_hooks_contribute_and_run_whole_models_on_their_target_kinds_only():
    plugin = backend_plugin(lower_whole_model=lambda model, model_format, func, name, target: name)
    mine, cuda = Backend("mine", OP_LEVEL, ("cpu",), "1"), target_of("cuda")
    assert plugin.collage_contribute_patterns(mine, cuda, "fp32") == []
    assert plugin.collage_lower_whole_model(mine, b"", "onnx", None, "main", cuda) is None
    everywhere = kit.backend_hooks(
        "mine", describe=None, missing=None, patterns=lambda target, precision: [target.kind.name], lowering=None, prepare_runtime=None
    )
    assert everywhere.collage_contribute_patterns(mine, cuda, "fp32") == ["cuda"], "no target_kinds: every target"


def test_backend_hooks_say_what_is_missing_and_raise_what_preparing_raised():
    def prepare_runtime():
        raise Missing("libmine not found: apt-get install libmine-dev")

    declared = kit.backend_hooks(
        "mine",
        describe=None,
        missing=kit.reason_raised_by(prepare_runtime, Missing),
        patterns=None,
        lowering=None,
        prepare_runtime=prepare_runtime,
    )
    pm = manager(types.SimpleNamespace(**declared.hookimpls()))
    mine = Backend("mine", OP_LEVEL, ("cpu",), "1")
    assert pm.hook.collage_check_availability(backend=mine) == Availability.no("libmine not found: apt-get install libmine-dev")
    with pytest.raises(Missing, match="libmine not found"):
        pm.hook.collage_prepare_runtime(backend=mine)


def test_reason_raised_by_is_none_when_the_check_returns_and_lets_other_errors_through():
    assert kit.reason_raised_by(lambda: "fine", Missing)() is None
    with pytest.raises(KeyError):
        kit.reason_raised_by(lambda: {}["absent"], Missing)()


def test_backend_hooks_leave_out_the_optional_hooks_unless_declared():
    plugin = backend_plugin()
    assert set(plugin.declared.hookimpls()) == {
        "collage_register_backends",
        "collage_check_availability",
        "collage_contribute_patterns",
        "collage_lower_partitions",
        "collage_prepare_runtime",
    }
    assert plugin.declared.collage_runtime_libraries is None and plugin.declared.collage_lower_whole_model is None
    pm = manager(plugin)
    assert pm.hook.collage_runtime_libraries(backend=Backend("mine", OP_LEVEL, ("cpu",), "1")) is None


def test_backend_hooks_tune_and_lower_whole_modules_for_their_backend_only():
    calls = []
    declared = kit.backend_hooks(
        "mine",
        describe=lambda: Backend("mine", OP_LEVEL, ("cpu",), "1"),
        missing=lambda: None,
        patterns=lambda target, precision: [],
        lowering=None,
        lower_module=lambda mod, names, target: calls.append(("lower", names)) or "the module lowered",
        prepare_runtime=lambda: None,
        tune_partitions=lambda mod, names, target, budget_s: calls.append(("tune", names, budget_s)) or len(names),
    )
    pm = manager(types.SimpleNamespace(**declared.hookimpls()))
    mine, theirs = Backend("mine", OP_LEVEL, ("cpu",), "1"), Backend("theirs", OP_LEVEL, ("cpu",), "1")
    llvm = tvm_compat.make_target("llvm")
    assert pm.hook.collage_tune_partitions(backend=mine, mod=None, function_names=["p0", "p1"], target=llvm, budget_s=5.0) == 2
    assert pm.hook.collage_tune_partitions(backend=theirs, mod=None, function_names=["p0"], target=llvm, budget_s=5.0) is None
    assert pm.hook.collage_lower_partitions(backend=mine, mod=None, function_names=["p0"], target=llvm) == "the module lowered"
    assert calls == [("tune", ["p0", "p1"], 5.0), ("lower", ["p0"])]
    with pytest.raises(TypeError, match="give both lowering and lower_module"):
        kit.backend_hooks(
            "mine", describe=None, missing=None, patterns=None, lowering=lambda *a: None, lower_module=lambda *a: None, prepare_runtime=None
        )


def test_backend_hooks_refuse_to_register_a_backend_of_another_name():
    misnamed = kit.backend_hooks(
        "mine", describe=lambda: Backend("other", OP_LEVEL, ("cpu",), "1"), missing=None, patterns=None, lowering=None, prepare_runtime=None
    )
    registered = []
    with pytest.raises(ValueError, match="the hooks declared for 'mine' describe a backend named 'other'"):
        misnamed.collage_register_backends(register=registered.append)
    assert registered == []


def test_every_shipped_hooks_module_is_a_declaration():
    hand_written = [str(path.relative_to(ROOT)) for path in PLUGINS.glob("*/collage_*/hooks.py") if "@hookimpl" in path.read_text()]
    assert hand_written == []


# native_kernel_hooks


def native_plugin(loads: list, missing: str = ""):
    def load():
        if missing:
            raise Missing(missing)
        loads.append("loaded")

    declared = kit.native_kernel_hooks(
        "mine",
        describe=lambda: Backend("mine", OP_LEVEL, ("cpu",), "1"),
        load=load,
        unavailable=Missing,
        target_kinds=("llvm",),
        patterns=lambda precision: [f"a pattern at {precision}"],
        lower_function=lambda func, name: func,
        built_library=lambda: Path("/kernels/libmine.so"),
    )
    return types.SimpleNamespace(**declared.hookimpls())


def test_native_kernel_hooks_implement_every_hook_of_a_native_backend_for_it_alone():
    loads = []
    pm = manager(native_plugin(loads))
    registered = []
    pm.hook.collage_register_backends(register=registered.append)
    (mine,) = registered
    theirs = Backend("theirs", OP_LEVEL, ("cpu",), "1")
    llvm, cuda = (types.SimpleNamespace(kind=types.SimpleNamespace(name=kind)) for kind in ("llvm", "cuda"))
    assert pm.hook.collage_check_availability(backend=mine) == Availability.yes()
    assert pm.hook.collage_contribute_patterns(backend=mine, target=llvm, precision="bf16") == [["a pattern at bf16"]]
    assert pm.hook.collage_contribute_patterns(backend=mine, target=cuda, precision="fp32") == [[]]
    assert pm.hook.collage_prepare_runtime(backend=mine) is True
    assert pm.hook.collage_runtime_libraries(backend=mine) == [Path("/kernels/libmine.so")]
    assert loads == ["loaded", "loaded"]
    for hook in ("collage_check_availability", "collage_prepare_runtime", "collage_runtime_libraries"):
        assert getattr(pm.hook, hook)(backend=theirs) is None
    assert pm.hook.collage_contribute_patterns(backend=theirs, target=llvm, precision="fp32") == []


def test_native_kernel_hooks_say_what_is_missing_and_refuse_a_misnamed_backend():
    pm = manager(native_plugin([], missing="libmine not found: apt-get install libmine-dev"))
    mine = Backend("mine", OP_LEVEL, ("cpu",), "1")
    assert pm.hook.collage_check_availability(backend=mine) == Availability.no("libmine not found: apt-get install libmine-dev")
    with pytest.raises(Missing, match="libmine not found"):
        pm.hook.collage_prepare_runtime(backend=mine)
    misnamed = kit.native_kernel_hooks(
        "mine",
        describe=lambda: Backend("other", OP_LEVEL, ("cpu",), "1"),
        load=None,
        unavailable=Missing,
        target_kinds=(),
        patterns=None,
        lower_function=None,
        built_library=None,
    )
    with pytest.raises(ValueError, match="describe a backend named 'other'"):
        misnamed.collage_register_backends(register=lambda backend: None)


# engine_hooks


def engine_plugin(monkeypatch, missing=lambda module: None, whole_onnx_model=None):
    """A graph-level engine ``mine`` declared with ``engine_hooks``, its engine a module ``mine_engine`` at 2.1;
    the plugin's ``calls`` lists what the declaration was asked."""
    monkeypatch.setitem(sys.modules, "mine_engine", types.SimpleNamespace(__version__="2.1"))
    calls = []

    def lowering(mod, function_names, target):
        calls.append(("lowering", list(function_names), target))
        return lambda func, name: func.with_attr("lowered_as", name)

    declared = kit.engine_hooks(
        "mine",
        engine="mine_engine",
        install_hint="pip install mine-engine",
        describe=lambda version: Backend("mine", kit.GRAPH_LEVEL, ("cpu",), f"{version}+lowering-1"),
        missing=missing,
        target_kinds=("llvm",),
        lowering=lowering,
        register_runtime=lambda: calls.append("registered"),
        sixteen_bit=lambda: calls.append("sixteen_bit") or frozenset({"bfloat16"}),
        whole_onnx_model=whole_onnx_model,
    )
    return types.SimpleNamespace(calls=calls, **declared.hookimpls())


def partitions_module():
    """A module of two one-parameter Relax functions, ``part`` and ``other``."""
    from tvm import relax

    builder = relax.BlockBuilder()
    for name in ("part", "other"):
        x = relax.Var("x", relax.TensorType((2,), "float32"))
        with builder.function(name, [x]):
            builder.emit_func_output(x)
    return builder.get()


def test_engine_hooks_implement_every_hook_of_a_graph_level_engine_for_it_alone(monkeypatch):
    plugin = engine_plugin(monkeypatch, whole_onnx_model=lambda model, func, name: (model, name))
    pm = manager(plugin)
    registered = []
    pm.hook.collage_register_backends(register=registered.append)
    (mine,) = registered
    assert mine.version == "2.1+lowering-1"
    theirs = Backend("theirs", kit.GRAPH_LEVEL, ("cpu",), "1")
    llvm, cuda = (types.SimpleNamespace(kind=types.SimpleNamespace(name=kind)) for kind in ("llvm", "cuda"))
    assert pm.hook.collage_check_availability(backend=mine) == Availability.yes()
    (patterns,) = pm.hook.collage_contribute_patterns(backend=mine, target=llvm, precision="fp32")
    assert [p.name for p in patterns] == [f"mine.{op.rsplit('.', 1)[1]}" for op in kit.engine_operators.SUPPORTED_OPS]
    assert pm.hook.collage_contribute_patterns(backend=mine, target=cuda, precision="fp32") == [[]]
    mod = partitions_module()
    lowered = pm.hook.collage_lower_partitions(backend=mine, mod=mod, function_names=["part"], target=llvm)
    assert lowered["part"].attrs["lowered_as"] == "part" and "lowered_as" not in lowered["other"].attrs
    assert plugin.calls == ["sixteen_bit", ("lowering", ["part"], llvm)]
    whole = dict(backend=mine, model=b"onnx bytes", func=mod["part"], name="main")
    assert pm.hook.collage_lower_whole_model(**whole, model_format="onnx", target=llvm) == (b"onnx bytes", "main")
    assert pm.hook.collage_lower_whole_model(**whole, model_format="onnx", target=cuda) is None
    assert pm.hook.collage_lower_whole_model(**whole, model_format="tflite", target=llvm) is None
    assert pm.hook.collage_prepare_runtime(backend=mine) is True
    assert plugin.calls[-1] == "registered"
    for hook in ("collage_check_availability", "collage_prepare_runtime"):
        assert getattr(pm.hook, hook)(backend=theirs) is None
    assert pm.hook.collage_contribute_patterns(backend=theirs, target=llvm, precision="fp32") == []


def test_engine_hooks_say_what_is_missing_and_what_cannot_be_imported(monkeypatch):
    pm = manager(engine_plugin(monkeypatch, missing=lambda module: f"mine_engine {module.__version__} has no CPU"))
    mine = Backend("mine", kit.GRAPH_LEVEL, ("cpu",), "1")
    assert pm.hook.collage_check_availability(backend=mine) == Availability.no("mine_engine 2.1 has no CPU")
    monkeypatch.setitem(sys.modules, "mine_engine", None)  # as if it were not installed
    availability = pm.hook.collage_check_availability(backend=mine)
    assert not availability.available and availability.reason.startswith("mine_engine cannot be imported (")
    assert availability.reason.endswith("): pip install mine-engine")
    with pytest.raises(RuntimeError, match="mine_engine cannot be imported"):
        pm.hook.collage_prepare_runtime(backend=mine)
    registered = []
    pm.hook.collage_register_backends(register=registered.append)
    assert registered[0].version == "not installed+lowering-1"


def test_engine_hooks_leave_out_the_whole_model_hook_unless_declared_and_refuse_a_misnamed_backend(monkeypatch):
    assert not hasattr(engine_plugin(monkeypatch), "collage_lower_whole_model")
    misnamed = kit.engine_hooks(
        "mine",
        engine="mine_engine",
        install_hint="",
        describe=lambda version: Backend("other", kit.GRAPH_LEVEL, ("cpu",), version),
        missing=None,
        target_kinds=(),
        lowering=None,
        register_runtime=None,
    )
    with pytest.raises(ValueError, match="describe a backend named 'other'"):
        misnamed.collage_register_backends(register=lambda backend: None)
