"""The plugin manager and each hook's contract, with fake distributions and small plugins made for tests."""

from __future__ import annotations

import importlib.metadata
import logging
import os
from pathlib import Path

import pluggy
import pytest
from plugins_for_tests import fixed_cost_plugin
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from collage_core import tvm_compat
from collage_core.backends import BackendError, contribute_patterns, discover_backends, select_backends
from collage_core.build.executable import BuildError, lower_partitions
from collage_core.build.partition import partition_module
from collage_core.hookspecs import hookimpl
from collage_core.measure.timing import MeasureSettings
from collage_core.measure.worker_client import MeasurementWorker
from collage_core.model.relax_graph import RelaxGraph
from collage_core.plugins import DISABLE_ENV, ENTRY_POINT_GROUP, PluginFailure, get_plugin_manager
from collage_core.records import OP_LEVEL, Availability, Backend, Cost, Pattern

TESTS = Path(__file__).resolve().parent
FIXED_COST_MODULE = fixed_cost_plugin.__name__
BROKEN_IMPORT_MODULE = "plugins_for_tests.broken_import_plugin"
MISSPELT_HOOK_MODULE = "plugins_for_tests.misspelt_hook_plugin"


def backend(name: str) -> Backend:
    return Backend(name, OP_LEVEL, ("cpu",), "1")


class Provides:
    """A plugin object providing one available backend, with a pattern for every operator."""

    def __init__(self, name: str):
        self.name = name

    @hookimpl
    def collage_register_backends(self, register):
        register(backend(self.name))

    @hookimpl
    def collage_check_availability(self, backend):
        return Availability.yes() if backend.name == self.name else None

    @hookimpl
    def collage_contribute_patterns(self, backend, target):
        return [Pattern(f"{self.name}.op", wildcard())] if backend.name == self.name else None


@pytest.fixture
def pm():
    return get_plugin_manager(disabled=(), load_entry_points=False)


@pytest.fixture
def fake_distributions(monkeypatch):
    """Make ``importlib.metadata.entry_points`` report the given (name, module) pairs and nothing else."""

    def install(*pairs):
        entry_points = [importlib.metadata.EntryPoint(name, module, ENTRY_POINT_GROUP) for name, module in pairs]

        def fake_entry_points(*, group):
            return [ep for ep in entry_points if ep.group == group]

        monkeypatch.setattr(importlib.metadata, "entry_points", fake_entry_points)

    return install


def two_op_graph() -> RelaxGraph:
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            rectified = bb.emit(relax.op.nn.relu(x))
            output = bb.emit_output(relax.op.exp(rectified))
        bb.emit_func_output(output)
    return RelaxGraph.from_function(bb.get()["main"])


class Part:
    def __init__(self, backend, nodes):
        self.backend, self.pattern, self.nodes = backend, f"{backend}.op", nodes


# --- loading


def test_the_tvm_plugin_loads_through_its_entry_point():
    pm = get_plugin_manager(disabled=())
    assert pm.get_plugin("tvm").__name__ == "collage_tvm.hooks"
    assert pm.failures == []
    assert discover_backends(pm)["tvm"].plugin == "tvm"


def test_a_plugin_whose_import_fails_is_recorded_and_the_others_load(fake_distributions):
    fake_distributions(("tvm", "collage_tvm.hooks"), ("broken", BROKEN_IMPORT_MODULE), ("fixedcost", FIXED_COST_MODULE))
    pm = get_plugin_manager(disabled=())
    assert [failure.name for failure in pm.failures] == ["broken"]
    assert "import failed: ImportError: libbroken.so not found" in pm.failures[0].reason
    assert pm.has_plugin("tvm") and pm.has_plugin("fixedcost") and not pm.has_plugin("broken")
    assert sorted(discover_backends(pm)) == ["fixedcost", "tvm"]


@pytest.mark.parametrize("blocked, tvm_loaded", [("fixedcost", True), (FIXED_COST_MODULE, True), (" tvm , fixedcost", False)])
def test_collage_disable_plugins_blocks_by_entry_point_or_module_name(fake_distributions, monkeypatch, blocked, tvm_loaded):
    fake_distributions(("tvm", "collage_tvm.hooks"), ("fixedcost", FIXED_COST_MODULE))
    monkeypatch.setenv(DISABLE_ENV, blocked)
    pm = get_plugin_manager()
    assert not pm.has_plugin("fixedcost")
    assert pm.has_plugin("tvm") == tvm_loaded
    assert "fixedcost" not in discover_backends(pm)


def test_a_misspelt_hook_implementation_fails_the_check(fake_distributions):
    fake_distributions(("misspelt", MISSPELT_HOOK_MODULE))
    with pytest.raises(pluggy.PluginValidationError, match="collage_register_backend"):
        get_plugin_manager(disabled=())


# --- collage_register_backends


def test_collage_register_backends_twice_the_same_name_names_both_plugins(pm):
    pm.register(Provides("shared"), name="first_plugin")
    pm.register(Provides("shared"), name="second_plugin")
    with pytest.raises(BackendError, match="'shared'") as error:
        discover_backends(pm)
    assert "first_plugin" in str(error.value) and "second_plugin" in str(error.value)


def test_collage_register_backends_raising_is_a_failure_and_others_still_appear(pm):
    class RaisesOnRegister:
        @hookimpl
        def collage_register_backends(self, register):
            raise RuntimeError("license server unreachable")

    pm.register(Provides("good"), name="good_plugin")
    pm.register(RaisesOnRegister(), name="raising_plugin")
    infos = discover_backends(pm)
    assert list(infos) == ["good"] and infos["good"].availability.available
    assert pm.failures == [PluginFailure("raising_plugin", "collage_register_backends raised RuntimeError: license server unreachable")]


def test_collage_register_backends_refuses_what_is_not_a_backend(pm):
    class RegistersAName:
        @hookimpl
        def collage_register_backends(self, register):
            register("fast")

    pm.register(RegistersAName(), name="sloppy_plugin")
    with pytest.raises(BackendError, match="sloppy_plugin registered 'fast', not a Backend"):
        discover_backends(pm)


# --- collage_check_availability


def test_collage_check_availability_raising_makes_the_backend_unavailable_with_the_reason(pm):
    class RaisesOnCheck(Provides):
        @hookimpl
        def collage_check_availability(self, backend):
            if backend.name == self.name:
                raise OSError("libflaky.so: cannot open shared object file")
            return None

    pm.register(Provides("good"), name="good_plugin")
    pm.register(RaisesOnCheck("flaky"), name="flaky_plugin")
    infos = discover_backends(pm)
    assert infos["good"].availability.available
    reason = infos["flaky"].availability.reason
    assert not infos["flaky"].availability.available
    assert "flaky_plugin" in reason and "OSError: libflaky.so: cannot open shared object file" in reason


def test_collage_check_availability_raising_for_every_backend_spares_the_others(pm):
    class RaisesForAll(Provides):
        @hookimpl
        def collage_check_availability(self, backend):
            raise OSError("libflaky.so: cannot open shared object file")

    pm.register(Provides("good"), name="good_plugin")
    pm.register(RaisesForAll("flaky"), name="flaky_plugin")
    infos = discover_backends(pm)
    assert "flaky_plugin" in infos["flaky"].availability.reason
    assert infos["good"].availability.available, infos["good"].availability.reason


def test_collage_check_availability_unanswered_is_unavailable(pm):
    class NeverAnswers(Provides):
        @hookimpl
        def collage_check_availability(self, backend):
            return None

    pm.register(NeverAnswers("silent"), name="silent_plugin")
    availability = discover_backends(pm)["silent"].availability
    assert availability == Availability.no("plugin silent_plugin does not say whether silent is available")


def test_select_backends_unknown_name_lists_the_installed_ones(pm):
    pm.register(Provides("alpha"), name="alpha_plugin")
    pm.register(Provides("beta"), name="beta_plugin")
    with pytest.raises(BackendError, match=r"unknown backend 'gamma' \(installed: alpha, beta\)"):
        select_backends(discover_backends(pm), ["alpha", "gamma"])


def test_select_backends_unavailable_name_gives_the_reason(pm):
    class Missing(Provides):
        @hookimpl
        def collage_check_availability(self, backend):
            return Availability.no("libdnnl not found: apt-get install libdnnl-dev") if backend.name == self.name else None

    pm.register(Provides("alpha"), name="alpha_plugin")
    pm.register(Missing("dnnl"), name="dnnl_plugin")
    infos = discover_backends(pm)
    with pytest.raises(BackendError, match="backend dnnl is not available: libdnnl not found: apt-get install libdnnl-dev"):
        select_backends(infos, ["dnnl"])
    assert [info.name for info in select_backends(infos)] == ["alpha"]


def test_a_backend_chosen_by_default_on_some_devices_is_placed_on_there_without_being_named(pm):
    class GpuByDefault(Provides):
        @hookimpl
        def collage_register_backends(self, register):
            register(Backend(self.name, OP_LEVEL, ("cpu", "cuda"), "1", chosen_by_default=("cuda",)))

    class OnlyWhenNamed(Provides):
        @hookimpl
        def collage_register_backends(self, register):
            register(Backend(self.name, OP_LEVEL, ("cpu", "cuda"), "1", chosen_by_default=False))

    pm.register(Provides("alpha"), name="alpha_plugin")
    pm.register(GpuByDefault("compiled"), name="compiled_plugin")
    pm.register(OnlyWhenNamed("slow"), name="slow_plugin")
    infos = discover_backends(pm)
    cpu, cuda = tvm_compat.make_target({"kind": "llvm"}), tvm_compat.make_target({"kind": "cuda"})
    assert [info.name for info in select_backends(infos, target=cuda)] == ["alpha", "compiled"]
    assert [info.name for info in select_backends(infos, target=cpu)] == ["alpha"]
    assert [info.name for info in select_backends(infos)] == ["alpha"]  # no target: only those chosen everywhere
    assert [info.name for info in select_backends(infos, ["slow", "compiled"], target=cpu)] == ["slow", "compiled"]


# --- collage_contribute_patterns


def test_collage_contribute_patterns_raising_leaves_out_only_that_plugins_patterns(pm, caplog):
    class AddsRelu:
        @hookimpl
        def collage_contribute_patterns(self, backend, target):
            return [Pattern("alpha.relu", is_op("relax.nn.relu")(wildcard()))] if backend.name == "alpha" else None

    class RaisesOnPatterns:
        @hookimpl
        def collage_contribute_patterns(self, backend, target):
            raise ValueError("pattern table is corrupt")

    pm.register(Provides("alpha"), name="alpha_plugin")
    pm.register(AddsRelu(), name="relu_plugin")
    pm.register(RaisesOnPatterns(), name="raising_plugin")
    with caplog.at_level(logging.WARNING, logger="collage"):
        patterns = contribute_patterns(pm, backend("alpha"), tvm_compat.host_cpu_target())
    assert sorted(pattern.name for pattern in patterns) == ["alpha.op", "alpha.relu"]
    assert "raising_plugin" in caplog.text and "pattern table is corrupt" in caplog.text


def test_collage_contribute_patterns_for_another_backend_is_refused(pm):
    class Trespasses:
        @hookimpl
        def collage_contribute_patterns(self, backend, target):
            return [Pattern("beta.op", wildcard())]

    pm.register(Trespasses(), name="trespassing_plugin")
    with pytest.raises(BackendError, match="trespassing_plugin contributed"):
        contribute_patterns(pm, backend("alpha"), tvm_compat.host_cpu_target())


def test_the_precision_reaches_plugins_that_take_it_and_tf32_patterns_only_at_tf32(pm):
    """A plugin written before the hook had ``precision`` (Provides) still contributes; one that takes it sees
    the run's precision, and a ``_tf32`` pattern at any other precision is an error naming the plugin."""
    seen = []

    class Tf32Aware:
        @hookimpl
        def collage_contribute_patterns(self, backend, target, precision):
            seen.append(precision)
            return [Pattern("alpha.dense_tf32", wildcard())] if backend.name == "alpha" else None

    pm.register(Provides("alpha"), name="alpha_plugin")
    pm.register(Tf32Aware(), name="tf32_plugin")
    patterns = contribute_patterns(pm, backend("alpha"), tvm_compat.host_cpu_target(), "tf32")
    assert sorted(pattern.name for pattern in patterns) == ["alpha.dense_tf32", "alpha.op"] and seen == ["tf32"]
    with pytest.raises(BackendError, match="tf32_plugin contributed the TF32 pattern alpha.dense_tf32 at precision fp32"):
        contribute_patterns(pm, backend("alpha"), tvm_compat.host_cpu_target())


# --- collage_lower_partitions


def test_collage_lower_partitions_returning_none_is_a_build_error(pm):
    pm.register(Provides("unlowered"), name="unlowered_plugin")
    placed = partition_module(two_op_graph(), [Part("unlowered", (0, 1))])
    with pytest.raises(BuildError, match="no plugin lowers partitions of backend unlowered"):
        lower_partitions(pm, placed, {"unlowered": backend("unlowered")}, tvm_compat.host_cpu_target())


def test_collage_lower_partitions_gets_each_backends_own_functions(pm):
    calls = []

    class Records(Provides):
        @hookimpl
        def collage_lower_partitions(self, backend, mod, function_names, target):
            if backend.name != self.name:
                return None
            calls.append((backend.name, list(function_names)))
            for name in function_names:
                assert mod[name].attrs["collage.backend"] == self.name
                assert mod[name].attrs["collage.pattern"] == f"{self.name}.op"
            return mod

    pm.register(Records("alpha"), name="alpha_plugin")
    pm.register(Records("beta"), name="beta_plugin")
    placed = partition_module(two_op_graph(), [Part("alpha", (0,)), Part("beta", (1,))])
    lower_partitions(pm, placed, {"alpha": backend("alpha"), "beta": backend("beta")}, tvm_compat.host_cpu_target())
    assert calls == [("alpha", ["collage_alpha_0"]), ("beta", ["collage_beta_1"])]


def test_collage_lower_partitions_on_an_uninstalled_backend_is_a_build_error(pm):
    placed = partition_module(two_op_graph(), [Part("gone", (0, 1))])
    with pytest.raises(BuildError, match="backend 'gone', which is not installed"):
        lower_partitions(pm, placed, {}, tvm_compat.host_cpu_target())


# --- collage_measure_candidate


def test_collage_measure_candidate_overrides_the_default_measurement_in_the_worker(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    target = tvm_compat.host_cpu_target()
    module = tmp_path / "candidate.json"
    module.write_text(tvm_compat.save_ir_json(two_op_graph().standalone_module([0])))
    quick = MeasureSettings(warmup=1, min_repeats=1, max_repeats=1, min_repeat_ms=1.0, time_bound_s=1.0, timeout_s=60.0)

    def measure(backend_name):
        request = {
            "op": "measure_candidate",
            "backend": backend_name,
            "pattern": f"{backend_name}.op",
            "module": str(module),
            "target": tvm_compat.target_to_json(target),
            "settings": quick.to_json(),
        }
        return Cost.from_json(worker.request(request, timeout_s=quick.timeout_s)["cost"])

    with MeasurementWorker(plugin_modules=[FIXED_COST_MODULE], disabled=[]) as worker:
        assert measure("fixedcost") == fixed_cost_plugin.FIXED_COST
        default = measure("tvm")
    assert default.is_measured and default.repeats == 1 and 0 < default.median_s < 0.1
