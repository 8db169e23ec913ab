"""Thread pools: the size every backend's own pool and TVM's take, and the cost keys they enter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from collage_core import tvm_compat
from collage_core.backends import contribute_patterns, discover_backends
from collage_core.candidates.enumeration import enumerate_candidates
from collage_core.errors import CollageError
from collage_core.measure import threads
from collage_core.measure.cost_db import CostDatabase, CostKey
from collage_core.measure.measurement import CANDIDATE_PROTOCOL, cost_key, measure_candidates
from collage_core.measure.threads import ENVIRONMENT_VARIABLE, backend_threads
from collage_core.measure.timing import MeasureSettings
from collage_core.model.model_import import load_model
from collage_core.model.relax_graph import RelaxGraph
from collage_core.plugins import get_plugin_manager
from collage_core.records import Backend, Cost

TESTS = Path(__file__).resolve().parent


THREAD_VARIABLES = (ENVIRONMENT_VARIABLE, "TVM_NUM_THREADS", "OMP_NUM_THREADS", *threads.WAIT_SETTINGS, *threads.OTHER_WAIT_VARIABLES)


@pytest.fixture
def no_thread_variables(monkeypatch):
    """An environment that sets none of the variables of thread pools: the machine's defaults."""
    for variable in THREAD_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    return monkeypatch


def test_every_core_this_process_may_use_by_default(monkeypatch):
    monkeypatch.delenv(ENVIRONMENT_VARIABLE, raising=False)
    assert backend_threads() == len(os.sched_getaffinity(0))


def test_fewer_when_asked_and_never_more_than_the_cores(monkeypatch):
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, "1")
    assert backend_threads() == 1
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, str(len(os.sched_getaffinity(0)) + 64))
    assert backend_threads() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_value_is_one_line_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, value)
    with pytest.raises(CollageError, match=f"^{ENVIRONMENT_VARIABLE}='{value}' is not a positive whole number of threads$"):
        backend_threads()


def test_the_graph_level_backends_take_it(monkeypatch):
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, "1")
    onnxruntime_runtime = pytest.importorskip("collage_onnxruntime.runtime")
    assert onnxruntime_runtime.session_options().intra_op_num_threads == 1
    openvino_runtime = pytest.importorskip("collage_openvino.runtime")
    assert openvino_runtime.compile_config()["INFERENCE_NUM_THREADS"] == 1
    inductor_runtime = pytest.importorskip("collage_inductor.runtime")
    assert inductor_runtime.threads() == 1


@pytest.mark.parametrize(
    "environ, cpus, machine, expected",
    [
        ({"TVM_NUM_THREADS": "3", "OMP_NUM_THREADS": "5"}, 8, "x86_64", 3),
        ({"OMP_NUM_THREADS": "5"}, 8, "x86_64", 5),
        ({}, 8, "x86_64", 4),  # hyper-threads left out
        ({}, 8, "aarch64", 8),
        ({}, 1, "x86_64", 1),  # never fewer than one
        ({"TVM_NUM_THREADS": " 6 threads"}, 8, "x86_64", 6),  # read as C's atoi
        ({"TVM_NUM_THREADS": "many"}, 8, "x86_64", 1),
    ],
)
def test_tvm_threads_follow_tvm_runtime_rule(monkeypatch, environ, cpus, machine, expected):
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(threads.platform, "machine", lambda: machine)
    assert threads.tvm_threads(environ) == expected


def test_the_machine_defaults_add_nothing_to_the_keys_and_other_sizes_name_both_pools(no_thread_variables):
    monkeypatch = no_thread_variables
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(threads.platform, "machine", lambda: "x86_64")
    assert threads.ThreadSettings.from_environment() == threads.ThreadSettings(tvm=2, backends=4)
    assert threads.key_part() == ""
    monkeypatch.setenv("TVM_NUM_THREADS", "2")  # what TVM takes here anyway: the same measurement
    assert threads.key_part() == ""
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, "1")
    assert threads.key_part() == "threads:tvm=2,backends=1"
    monkeypatch.setenv("TVM_NUM_THREADS", "1")
    assert threads.key_part() == "threads:tvm=1,backends=1"
    monkeypatch.delenv(ENVIRONMENT_VARIABLE)
    assert threads.key_part() == "threads:tvm=1,backends=4"
    monkeypatch.delenv("TVM_NUM_THREADS")
    monkeypatch.setenv("GOMP_SPINCOUNT", threads.WAIT_SETTINGS["GOMP_SPINCOUNT"])  # Collage's own: the same
    assert threads.key_part() == ""
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # the user's policy, and no spin count of Collage's
    assert threads.key_part() == "threads:tvm=2,backends=4,OMP_WAIT_POLICY=PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # idle threads that spin measure other costs
    monkeypatch.setenv("GOMP_SPINCOUNT", "300000")
    assert threads.key_part() == "threads:tvm=2,backends=4,GOMP_SPINCOUNT=300000,OMP_WAIT_POLICY=ACTIVE"


def test_cpu_cost_keys_carry_other_thread_settings_and_gpu_keys_do_not(no_thread_variables):
    monkeypatch = no_thread_variables
    backend = Backend("tvm", "op-level", ("cpu", "cuda"), "1")
    cpu, gpu = tvm_compat.host_cpu_target(), tvm_compat.make_target({"kind": "cuda", "arch": "sm_90a"})
    default_cpu, default_gpu = cost_key(backend, cpu, "abc"), cost_key(backend, gpu, "abc")
    monkeypatch.setenv("TVM_NUM_THREADS", str(threads.tvm_threads({}) + 1))
    assert cost_key(backend, cpu, "abc") != default_cpu
    assert cost_key(backend, cpu, "abc").device.endswith(threads.key_part())
    assert cost_key(backend, gpu, "abc") == default_gpu


def _old_key(backend: Backend, target, candidate_key: str) -> CostKey:
    """A candidate's key as Collage wrote it before thread settings entered the keys."""
    return CostKey(
        backend.name,
        backend.version,
        tvm_compat.target_to_json(target),
        tvm_compat.device_name(target),
        f"{CANDIDATE_PROTOCOL}:{candidate_key}",
    )


def test_a_warm_database_answers_default_settings_and_other_settings_measure_anew(no_thread_variables, tmp_path):
    """A row written before thread settings entered the keys answers a run with the machine's
    defaults; a run with TVM's pool at another size measures the candidate itself."""
    from plugins_for_tests import fixed_cost_plugin as plugin

    monkeypatch = no_thread_variables
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    module = "plugins_for_tests.fixed_cost_plugin"
    pm = get_plugin_manager(extra_modules=[module])
    backend = discover_backends(pm)[plugin.BACKEND].backend
    target = tvm_compat.host_cpu_target()
    model = load_model(str(TESTS.parent / "models" / "tiny_resnet.onnx"))
    graph = RelaxGraph.from_function(model.mod["main"], model.mod)
    candidates = [c for c in enumerate_candidates(graph, contribute_patterns(pm, backend, target)) if c.nodes == {0}]
    remembered = Cost.measured(7.0, 0.0, 3)
    with CostDatabase.open(tmp_path / "costs.sqlite") as db:
        db.put(_old_key(backend, target, candidates[0].key), remembered)

        def measure():
            return measure_candidates(
                graph, candidates, {plugin.BACKEND: backend}, target, db, MeasureSettings(build_workers=1), [module], show_progress=False
            )

        warm = measure()
        assert (warm.from_database, warm.costs[candidates[0].key]) == (1, remembered)
        monkeypatch.setenv("TVM_NUM_THREADS", str(threads.tvm_threads({}) + 1))
        other = measure()
        assert (other.measured, other.costs[candidates[0].key]) == (1, plugin.FIXED_COST)


def test_results_json_records_the_thread_settings_the_run_had(no_thread_variables):
    from types import SimpleNamespace

    from collage_core.outputs.result import OptimizedModel

    monkeypatch = no_thread_variables
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, "1")
    monkeypatch.setenv("TVM_NUM_THREADS", "3")
    placement = SimpleNamespace(search="op-level", why_chosen="")
    result = OptimizedModel(
        model=SimpleNamespace(name="m", precision="fp32"),
        placement=placement,
        library_path=Path("m.so"),
        target=None,
        end_to_end=[],
        verification=None,
        measurement=None,
        candidates=0,
        search_s=0.0,
        partitioned_mod=None,
    )
    monkeypatch.delenv("TVM_NUM_THREADS")  # what the run had, not what the process has when it saves
    assert result.results_json()["threads"] == {"tvm": 3, "backends": 1, "waiting": threads.WAIT_SETTINGS}


def test_collages_spin_count_is_added_only_where_the_user_chose_nothing_of_how_openmp_waits():
    assert threads.environment_for_partitions({"PATH": "/bin"}) == {"PATH": "/bin", **threads.WAIT_SETTINGS}
    assert threads.wait_settings_in_force({"PATH": "/bin"}) == threads.WAIT_SETTINGS
    # libgomp takes a spin count over the policy: one of Collage's would undo the user's policy.
    assert threads.environment_for_partitions({"OMP_WAIT_POLICY": "ACTIVE"}) == {"OMP_WAIT_POLICY": "ACTIVE"}
    assert threads.wait_settings_in_force({"OMP_WAIT_POLICY": "ACTIVE", "PATH": "/bin"}) == {}
    assert threads.environment_for_partitions({"GOMP_SPINCOUNT": "5"}) == {"GOMP_SPINCOUNT": "5"}
    assert threads.wait_settings_in_force({"GOMP_SPINCOUNT": "5"}) == {"GOMP_SPINCOUNT": "5"}


def _started_environment(worker) -> dict:
    """The environment the worker's process (or the zygote it was forked from) started with: what
    its libraries read as they loaded."""
    pid = worker.request({"op": "init", "plugins": [], "disabled": []}, 120)["pid"]
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode().split("=", 1) for entry in entries if b"=" in entry)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads a process's environment from /proc")
@pytest.mark.parametrize("started", ["forked", "exec"])
def test_processes_that_run_partitions_start_with_idle_threads_that_spin_briefly(monkeypatch, started):
    from collage_core.measure.worker_client import MeasurementWorker

    for name in threads.USER_WAIT_CHOICES:
        monkeypatch.delenv(name, raising=False)
    with MeasurementWorker([], [], env=dict(os.environ) if started == "exec" else None) as worker:
        environment = _started_environment(worker)
    assert {name: environment.get(name) for name in threads.USER_WAIT_CHOICES} == {**threads.WAIT_SETTINGS, "OMP_WAIT_POLICY": None}


def test_an_exported_mix_of_backends_names_how_idle_threads_wait_and_loading_it_says_when_the_process_differs(
    monkeypatch, tmp_path, caplog
):
    from collage_core.build import deploy

    for name in threads.USER_WAIT_CHOICES:
        monkeypatch.delenv(name, raising=False)
    needs = {name: {"kind": "op-level", "version": "1", "needs": ""} for name in ("dnnl", "tvm")}
    mixed, alone = tmp_path / "mixed.so", tmp_path / "alone.so"
    for library in (mixed, alone):
        library.write_bytes(b"")
    deploy.write_runtime_file(mixed, needs)
    deploy.write_runtime_file(alone, {"tvm": needs["tvm"]})
    assert deploy.read_runtime_file(mixed)["environment"] == threads.WAIT_SETTINGS
    assert "environment" not in deploy.read_runtime_file(alone)  # one pool: nothing takes turns
    monkeypatch.setenv("GOMP_SPINCOUNT", "300000")  # a copy made elsewhere keeps what it was measured with
    copied = tmp_path / "copied.so"
    deploy.copy_library(mixed, copied)
    assert deploy.read_runtime_file(copied)["environment"] == threads.WAIT_SETTINGS

    with caplog.at_level("WARNING", logger="collage"):
        for _ in range(2):
            deploy.tell_other_environment("copied.so", threads.WAIT_SETTINGS)
    told = [record.getMessage() for record in caplog.records]
    assert len(told) == len(threads.WAIT_SETTINGS)  # each once, in this process
    assert any("measured with GOMP_SPINCOUNT=30000; this process has GOMP_SPINCOUNT=300000" in message for message in told)
    caplog.clear()
    monkeypatch.setattr(deploy, "_environment_told", set())
    for name, value in threads.WAIT_SETTINGS.items():
        monkeypatch.setenv(name, value)
    with caplog.at_level("WARNING", logger="collage"):
        deploy.tell_other_environment("copied.so", threads.WAIT_SETTINGS)
    assert not caplog.records
