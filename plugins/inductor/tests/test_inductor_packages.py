"""Programs compiled once per machine by AOTInductor: a package written whole under the cache folder, loaded by
later processes without compiling, compiled again when unreadable, and ``torch.compile`` where AOTInductor fails.

The region is conv2d, bias, ReLU and scale (``placement_cases.conv_bias_relu_scale``), lowered as Collage lowers it
and run through ``collage_inductor.run`` as the VM calls it; its results are held to numpy's within
``placement_cases``' RTOL/ATOL (1e-5: float32 sums of 27 products, ordered differently). Each test uses a cache
folder of its own, holding a copy of the package this process compiled once (AOTInductor compiles this region in
10-25 s on 2 busy cores).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch
from collage_inductor import hooks, runtime

from collage_core.kit import tvm_compat
from collage_core.kit.testing import partitions_by_backend
from collage_core.kit.testing.placement_cases import (
    ATOL,
    CONV_INPUT,
    DEVICE,
    RNG,
    RTOL,
    F,
    conv_bias_relu_scale,
    module,
    numpy_conv_bias_relu_scale,
    place,
)

CPU = (runtime.CPU, 0)
OUTPUT_SHAPE = (1, 8, 8, 8)
RUN_IN_A_NEW_PROCESS = r"""
import json, sys, time
import numpy as np, tvm
from collage_inductor import runtime

key, blob_path, x_path, out_path, mode = sys.argv[1:]
compiled = []
compile_package = runtime._compile_package


def counted(*args):
    if mode == "load only":
        raise AssertionError("the package was compiled again")
    compiled.append(True)
    return compile_package(*args)


runtime._compile_package = counted
blob, x = (tvm.runtime.tensor(np.load(path)) for path in (blob_path, x_path))
out = tvm.runtime.tensor(np.zeros(%r, "float32"))
started = time.perf_counter()
runtime.run(key, blob, x, out)
np.save(out_path, out.numpy())
print(json.dumps({"compiled": bool(compiled), "first_call_s": time.perf_counter() - started}))
""" % (OUTPUT_SHAPE,)


@pytest.fixture(scope="module")
def region(backends):
    """The key and program of conv-bias-ReLU-scale lowered whole for Inductor, and an input with numpy's answer."""
    _, placed = place(module(conv_bias_relu_scale, CONV_INPUT), "inductor", {0, 1, 2, 3})
    (name,) = partitions_by_backend(placed)["inductor"]
    lowered = hooks.collage_lower_partitions(backends["inductor"], placed, [name], tvm_compat.host_cpu_target())
    (binding,) = lowered[name].body.blocks[0].bindings
    key, program, _ = binding.value.args[1].fields
    x = RNG.uniform(-1, 1, size=CONV_INPUT[0]).astype(F)
    return key.value, tvm_compat.constant_array(program), x, numpy_conv_bias_relu_scale(x)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache folder of the test's own, and no program kept from another test."""
    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path / "cache"))
    runtime.PROGRAMS.clear()
    yield tmp_path / "cache"
    runtime.PROGRAMS.clear()


@pytest.fixture(scope="module")
def compiled(region, tmp_path_factory):
    """The region compiled by this process into a cache folder of its own: the folder, and the result it gave."""
    folder = tmp_path_factory.mktemp("compiled") / "cache"
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("COLLAGE_CACHE_DIR", str(folder))
        runtime.PROGRAMS.clear()
        try:
            result = run_here(region)
        finally:
            runtime.PROGRAMS.clear()
    return folder, result


@pytest.fixture
def package(compiled, cache):
    """A copy of the compiled package in the test's cache folder."""
    target = cache / "inductor" / "aoti"
    shutil.copytree(compiled[0] / "inductor" / "aoti", target)
    return only_package(cache)


def run_here(region) -> np.ndarray:
    key, blob, x, _ = region
    out = tvm_compat.to_tensor(np.zeros(OUTPUT_SHAPE, F), DEVICE)
    runtime.run(key, tvm_compat.to_tensor(blob, DEVICE), tvm_compat.to_tensor(x, DEVICE), out)
    return tvm_compat.to_numpy(out)


def run_in_new_processes(region, tmp_path, cache, modes) -> list[dict]:
    """``region`` run by one new Python process per mode, all at once (``"load only"`` fails if it compiles)."""
    key, blob, x, expected = region
    np.save(tmp_path / "blob.npy", blob)
    np.save(tmp_path / "x.npy", x)
    environment = {**os.environ, "COLLAGE_CACHE_DIR": str(cache)}
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RUN_IN_A_NEW_PROCESS,
                key,
                str(tmp_path / "blob.npy"),
                str(tmp_path / "x.npy"),
                str(tmp_path / f"out{index}.npy"),
                mode,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment,
        )
        for index, mode in enumerate(modes)
    ]
    results = []
    for index, process in enumerate(processes):
        stdout, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr[-3000:]
        np.testing.assert_allclose(np.load(tmp_path / f"out{index}.npy"), expected, rtol=RTOL, atol=ATOL)
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    return results


def only_package(cache):
    (package,) = (cache / "inductor" / "aoti").glob("*.pt2")
    return package


def test_a_region_compiled_in_one_process_is_loaded_by_the_next_without_compiling(region, compiled, package, tmp_path):
    folder, result = compiled
    np.testing.assert_allclose(result, region[3], rtol=RTOL, atol=ATOL)
    (made,) = (folder / "inductor" / "aoti").iterdir()  # the package alone: no temporary file left
    assert made.name == package.name == runtime.package_path(region[0], CPU).name
    assert package.name.startswith(region[0]) and zipfile.ZipFile(package).testzip() is None
    (loaded,) = run_in_new_processes(region, tmp_path, package.parents[2], ["load only"])
    assert not loaded["compiled"]


def test_the_package_name_holds_what_decides_the_compiled_code(region, cache, monkeypatch):
    key = region[0]
    path = runtime.package_path(key, CPU)
    assert path.parent == cache / "inductor" / "aoti"
    signature = runtime.build_signature(CPU)
    assert signature["torch"] == torch.__version__ and signature["device"] == "cpu" and signature["processor"]
    monkeypatch.setattr(runtime, "PACKAGE_REVISION", runtime.PACKAGE_REVISION + 1)
    assert runtime.package_path(key, CPU) != path
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    assert runtime.package_path(key, CPU) != path


def truncated(package):
    package.write_bytes(package.read_bytes()[: package.stat().st_size // 2])


def one_byte_flipped(package):
    data = bytearray(package.read_bytes())
    with zipfile.ZipFile(package) as archive:
        library = next(info for info in archive.infolist() if info.filename.endswith(".so"))
    data[library.header_offset + 30 + len(library.filename) + library.compress_size // 2] ^= 0xFF
    package.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [truncated, one_byte_flipped])
def test_a_damaged_package_is_found_out_with_one_warning(package, caplog, damage):
    damage(package)
    with caplog.at_level(logging.WARNING, logger="collage.inductor"):
        assert runtime._load_package(package, CPU) is None
    (record,) = caplog.records
    assert f"the compiled package {package.name} cannot be read" in record.getMessage()
    assert "compiling it again" in record.getMessage() and "\n" not in record.getMessage()


@pytest.mark.slow
def test_a_truncated_package_is_compiled_again(region, package, caplog):
    truncated(package)
    with caplog.at_level(logging.WARNING, logger="collage.inductor"):
        np.testing.assert_allclose(run_here(region), region[3], rtol=RTOL, atol=ATOL)
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        f"collage_inductor: the compiled package {package.name} cannot be read"
    ]
    assert zipfile.ZipFile(package).testzip() is None
    runtime.PROGRAMS.clear()
    caplog.clear()
    np.testing.assert_allclose(run_here(region), region[3], rtol=RTOL, atol=ATOL)
    assert caplog.records == []
    assert isinstance(runtime.PROGRAMS.find(region[0], CPU).compiled, runtime._Package)


def test_a_program_aotinductor_cannot_compile_runs_through_torch_compile(region, cache, caplog, monkeypatch):
    import torch._inductor

    def refuses(*args, **kwargs):
        raise RuntimeError("no lowering for aten.made_up\nwith a long explanation after it")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", refuses)
    with caplog.at_level(logging.WARNING, logger="collage.inductor"):
        np.testing.assert_allclose(run_here(region), region[3], rtol=RTOL, atol=ATOL)
    (record,) = caplog.records
    assert record.getMessage() == (
        f"collage_inductor: AOTInductor cannot compile program {region[0][:16]} "
        "(RuntimeError: no lowering for aten.made_up); torch.compile runs it in each process"
    )
    path = runtime.package_path(region[0], CPU)
    assert not path.exists() and path.with_name(path.name + runtime.FAILED_SUFFIX).is_file()
    # A later process goes to torch.compile at once: AOTInductor is not asked again.
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", lambda *a, **k: pytest.fail("asked again"))
    runtime.PROGRAMS.clear()
    caplog.clear()
    np.testing.assert_allclose(run_here(region), region[3], rtol=RTOL, atol=ATOL)
    assert not isinstance(runtime.PROGRAMS.find(region[0], CPU).compiled, runtime._Package)


@pytest.mark.slow  # two AOTInductor compilations at once: 30-60 s on 2 cores
def test_two_processes_compiling_the_same_program_at_once_both_end_with_a_whole_package(region, cache, tmp_path):
    results = run_in_new_processes(region, tmp_path, cache, ["compile", "compile"])
    package = only_package(cache)
    assert zipfile.ZipFile(package).testzip() is None
    assert sorted(path.name for path in package.parent.iterdir()) == [package.name]
    assert any(result["compiled"] for result in results)
    (loaded,) = run_in_new_processes(region, tmp_path, cache, ["load only"])
    assert not loaded["compiled"]
