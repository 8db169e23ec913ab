"""Exported libraries loaded in a fresh process by their runtime file, and what loading says when a backend is missing."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import tvm
from runtime_only import RUNTIME_ONLY_CHECK
from tvm import relax

from collage_core import tvm_compat
from collage_core.backends import discover_backends
from collage_core.build.deploy import (
    LibraryLoadError,
    backend_needs,
    carried_dir,
    copy_library,
    load_vm,
    prepare_runtime,
    runtime_file,
    runtime_libraries,
    write_runtime_file,
)
from collage_core.build.executable import build
from collage_core.build.partition import partition_module
from collage_core.model.relax_graph import RelaxGraph
from collage_core.plugins import first_result, get_plugin_manager

R = relax.op
F = "float32"
RNG = np.random.default_rng(0)
WEIGHTS = RNG.uniform(-1, 1, size=(8, 4, 3, 3)).astype(F)


def conv_relu_sigmoid() -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType((1, 4, 9, 9), F))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = bb.emit(R.nn.relu(bb.emit(R.nn.conv2d(x, relax.const(WEIGHTS), padding=1))))
            output = bb.emit_output(R.multiply(bb.emit(R.sigmoid(conv)), conv))
        bb.emit_func_output(output)
    return bb.get()


@pytest.fixture(scope="module")
def pm():
    return get_plugin_manager()


@pytest.fixture(scope="module")
def backends(pm):
    infos = discover_backends(pm)
    if "dnnl" not in infos or not infos["dnnl"].availability.available:
        pytest.skip("the DNNL backend is not available here")
    return {name: info.backend for name, info in infos.items()}


@pytest.fixture(scope="module")
def exported(tmp_path_factory, pm, backends):
    """conv2d+relu on DNNL, the rest on TVM, exported with its runtime file; and its output in this process."""
    mod = conv_relu_sigmoid()
    graph = RelaxGraph.from_function(mod["main"])
    parts = [SimpleNamespace(backend="dnnl", pattern="dnnl.conv2d_relu", nodes=frozenset({0, 1}))]
    parts += [SimpleNamespace(backend="tvm", pattern="tvm.op", nodes=frozenset({n})) for n in (2, 3)]
    executable = build(pm, partition_module(graph, parts), backends, tvm_compat.host_cpu_target())
    library = tmp_path_factory.mktemp("deploy") / "mixed.so"
    executable.export_library(str(library))
    used = [backends["dnnl"], backends["tvm"]]
    write_runtime_file(library, backend_needs(used, {"dnnl", "tvm"}), runtime_libraries(pm, used))
    x = RNG.uniform(-1, 1, size=(1, 4, 9, 9)).astype(F)
    vm = relax.VirtualMachine(executable, tvm.cpu(0))
    return library, x, tvm_compat.to_numpy(vm["main"](tvm_compat.to_tensor(x, tvm.cpu(0))))


def test_runtime_file_names_each_backend_with_what_it_needs(exported):
    library, _, _ = exported
    record = json.loads(runtime_file(library).read_text())
    assert record["format"] == "collage-runtime" and sorted(record["backends"]) == ["dnnl", "tvm"]
    assert "libdnnl-dev" in record["backends"]["dnnl"]["needs"] and record["backends"]["tvm"]["needs"] == ""


def test_library_runs_in_a_fresh_process_loaded_by_its_runtime_file(exported, tmp_path):
    library, x, expected = exported
    np.save(tmp_path / "x.npy", x)
    code = (
        "import sys, numpy as np, tvm\n"
        "from collage_core.build.deploy import load_vm\n"
        "vm = load_vm(sys.argv[1])\n"
        "out = vm['main'](tvm.runtime.tensor(np.load(sys.argv[2])))\n"
        "np.save(sys.argv[3], out.numpy())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(library), str(tmp_path / "x.npy"), str(tmp_path / "out.npy")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    # Exported before any VM ran on its executable: TVM's VM records an empty memory scope for each constant
    # it reads into the executable it runs, and a library exported after that logs "Scope Loaded" for each.
    assert "Scope Loaded" not in result.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), expected)


# Versions a library may have been built with, from the installed one: the reported case was a library built
# with kernels-1 loaded silently under kernels-1+threads-1.
OTHER_VERSIONS = {"shorter": lambda installed: installed.rsplit("+", 1)[0], "longer": lambda installed: f"{installed}+threads-1"}


@pytest.mark.parametrize("other", OTHER_VERSIONS)
def test_a_library_built_with_other_backend_versions_warns_naming_both_or_with_strict_is_refused(exported, tmp_path, caplog, other):
    library, x, expected = exported
    older = tmp_path / "older.so"
    copy_library(library, older)
    record = json.loads(runtime_file(older).read_text())
    installed = record["backends"]["dnnl"]["version"]  # exported in this session: the installed version
    recorded = record["backends"]["dnnl"]["version"] = OTHER_VERSIONS[other](installed)
    runtime_file(older).write_text(json.dumps(record))
    said = f"was built with dnnl {recorded}, and dnnl {installed} is installed here: its partitions run on the installed version"
    with pytest.raises(LibraryLoadError, match=re.escape(f"{older} {said}")):
        load_vm(older, strict=True)
    with caplog.at_level(logging.WARNING, logger="collage"):
        vm = load_vm(older, origin="the shipped model")
    assert [r.getMessage() for r in caplog.records if "was built with" in r.getMessage()] == [f"the shipped model {said}"]
    out = vm["main"](tvm_compat.to_tensor(x, tvm.cpu(0)))
    np.testing.assert_array_equal(tvm_compat.to_numpy(out), expected)


def test_a_library_built_with_the_installed_versions_loads_without_a_word(exported, caplog):
    library, _, _ = exported
    with caplog.at_level(logging.WARNING, logger="collage"):
        load_vm(library, strict=True)
    assert not [r for r in caplog.records if "was built with" in r.getMessage()]


RUN_LIBRARY = (
    "import sys, numpy as np, tvm\n"
    "from collage_core.build.deploy import load_vm\n"
    "vm = load_vm(sys.argv[1])\n"
    "out = vm['main'](tvm.runtime.tensor(np.load(sys.argv[2])))\n"
    "np.save(sys.argv[3], out.numpy())\n"
)


def run_library_alone(library, x, tmp_path, env):
    np.save(tmp_path / "x.npy", x)
    return subprocess.run(
        [sys.executable, "-c", RUNTIME_ONLY_CHECK + RUN_LIBRARY, str(library), str(tmp_path / "x.npy"), str(tmp_path / "out.npy")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_the_library_carries_its_native_kernels_and_runs_with_tvm_runtime_alone(exported, tmp_path, runtime_only_env):
    """No TVM compiler, no C++ compiler, no plugin asked: the DNNL kernels come from the copy beside the library."""
    library, x, expected = exported
    record = json.loads(runtime_file(library).read_text())
    assert record["backends"]["tvm"]["carried"] == []
    (carried,) = record["backends"]["dnnl"]["carried"]
    assert (library.parent / carried).is_file() and (library.parent / carried).parent.parent == carried_dir(library)
    result = run_library_alone(library, x, tmp_path, runtime_only_env)
    assert result.returncode == 0, result.stderr[-2000:]
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), expected)


def test_with_tvm_runtime_alone_a_missing_carried_library_or_a_python_backend_is_named(exported, tmp_path, runtime_only_env):
    library, x, _ = exported
    record = json.loads(runtime_file(library).read_text())
    moved = tmp_path / "moved" / library.name
    moved.parent.mkdir()
    moved.write_bytes(library.read_bytes())
    runtime_file(moved).write_text(json.dumps(record))  # the .libs folder left behind
    result = run_library_alone(moved, x, tmp_path, runtime_only_env)
    assert result.returncode != 0
    assert f"{moved}: backend dnnl's runtime library {moved.parent / record['backends']['dnnl']['carried'][0]} is missing" in result.stderr
    del record["backends"]["dnnl"]["carried"]  # as a backend whose partitions need their plugin at run time
    runtime_file(moved).write_text(json.dumps(record))
    result = run_library_alone(moved, x, tmp_path, runtime_only_env)
    assert "partitions run on backend dnnl, which needs its plugin at run time, and TVM here is runtime-only" in result.stderr


def test_a_library_whose_backend_is_not_installed_says_which_and_how(exported):
    library, _, _ = exported
    with pytest.raises(
        LibraryLoadError, match=r"mixed\.so: partitions run on backend dnnl, which is not installed here: .*apt-get install libdnnl-dev"
    ):
        load_vm(library, pm=get_plugin_manager(disabled=["dnnl"]))


def test_a_missing_or_corrupt_runtime_file_is_named(exported, tmp_path):
    library, _, _ = exported
    lonely = tmp_path / "lonely.so"
    lonely.write_bytes(library.read_bytes())
    with pytest.raises(LibraryLoadError, match=r"lonely\.so: no lonely\.so\.runtime\.json beside it"):
        prepare_runtime(lonely)
    runtime_file(lonely).write_text("{not json")
    with pytest.raises(LibraryLoadError, match=r"lonely\.so\.runtime\.json: not JSON"):
        prepare_runtime(lonely)
    runtime_file(lonely).write_text(json.dumps({"format": "collage-runtime", "version": 99, "backends": {}}))
    with pytest.raises(LibraryLoadError, match="runtime file version 99"):
        prepare_runtime(lonely)


def test_collage_runtime_libraries_names_native_kernels_and_nothing_for_tvm(pm, backends):
    carried = runtime_libraries(pm, backends.values())
    assert carried["tvm"] == []
    assert [path.name for path in carried["dnnl"]] == ["libcollage_dnnl.so"] and carried["dnnl"][0].is_file()
    assert "onnxruntime" not in carried  # its partitions call Python at run time: the plugin is needed


def test_collage_prepare_runtime_registers_what_partitions_call(pm, backends):
    for name, function in (("dnnl", "collage_dnnl.run"), ("onnxruntime", "collage_onnxruntime.run"), ("tvm", None)):
        if name not in backends:
            continue
        ready, errors = first_result(pm.hook.collage_prepare_runtime, backend=backends[name])
        assert ready is True and not errors
        if function:
            assert tvm.get_global_func(function, allow_missing=True) is not None
