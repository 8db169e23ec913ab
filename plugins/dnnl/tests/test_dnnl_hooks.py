"""The DNNL backend's hooks, its refusals, its library build, and its executables in a mixed placement."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import tvm
from collage_dnnl import hooks, library, lowering, patterns, specs
from test_dnnl_kernels import DEVICE, TARGET, W8, dnnl_candidates, module, np_conv2d, uniform, whole_candidate
from tvm import relax

from collage_core.kit import OP_LEVEL, RelaxGraph, tvm_compat
from collage_core.kit.testing import build, contribute_patterns, lower_partitions, partition_module

R = relax.op
F = "float32"


def test_collage_register_backends_registers_an_op_level_cpu_backend(backends):
    backend = backends["dnnl"]
    assert backend.kind == OP_LEVEL and backend.device_kinds == ("cpu",)
    assert backend.version.startswith(f"onednn-{library.find_onednn().version}+kernels-")


def test_collage_check_availability_names_the_fix_when_onednn_is_missing(backends, monkeypatch, tmp_path):
    assert hooks.collage_check_availability(backend=backends["dnnl"]).available
    monkeypatch.setattr(library, "_roots", lambda: [tmp_path])
    library.load.cache_clear()
    try:
        availability = hooks.collage_check_availability(backend=backends["dnnl"])
    finally:
        library.load.cache_clear()
    assert not availability.available
    assert "apt-get install libdnnl-dev" in availability.reason


def test_onednn_3_is_reported_as_the_wrong_version(tmp_path, monkeypatch):
    headers = tmp_path / "include" / "oneapi" / "dnnl"
    headers.mkdir(parents=True)
    (headers / "dnnl.hpp").write_text("")
    (headers / "dnnl_version.h").write_text("#define DNNL_VERSION_MAJOR 3\n#define DNNL_VERSION_MINOR 13\n#define DNNL_VERSION_PATCH 2\n")
    (headers / "dnnl_config.h").write_text("#define DNNL_CPU_RUNTIME DNNL_RUNTIME_SYCL\n")
    monkeypatch.setattr(library, "_roots", lambda: [tmp_path])
    with pytest.raises(library.OneDNNUnavailable, match=r"oneDNN 3\.13\.2 at .* needs 2\.x.*apt-get install libdnnl-dev"):
        library.find_onednn()


def test_library_is_built_once_per_source_and_versions(tmp_path, monkeypatch):
    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path))
    onednn = library.find_onednn()
    path = library.build(onednn)
    assert path.is_file() and path.is_relative_to(tmp_path)
    built_at = path.stat().st_mtime_ns
    assert library.build(onednn) == path and path.stat().st_mtime_ns == built_at
    changed = library.OneDNN(onednn.include_dir, onednn.library_dir, "2.6.99", onednn.threading)
    assert library.library_path(changed) != path


def test_collage_contribute_patterns_only_on_cpu_targets(pm, backends):
    names = {p.name for p in contribute_patterns(pm, backends["dnnl"], TARGET)}
    assert {"dnnl.conv2d_bias_add_relu", "dnnl.dense_bias_gelu", "dnnl.batch_matmul_nt_scale", "dnnl.layer_norm"} <= names
    cuda = tvm_compat.make_target({"kind": "cuda"})
    assert hooks.collage_contribute_patterns(backend=backends["dnnl"], target=cuda, precision="fp32") == []


def refused(make, *shapes, dtype=F) -> list[str]:
    """The DNNL patterns that match some operators of ``main`` but were refused by their checks."""
    mod = module(make, *shapes, dtype=dtype)
    graph, candidates = dnnl_candidates(mod)
    var2val = relax.analysis.get_var2val(graph.func)
    matched = {p.name for p in patterns.patterns() for n in range(len(graph.graph)) if p.dpl.match(graph.call(n), var2val)}
    return sorted(matched - {c.pattern for c in candidates})


W_NHWC = uniform(8, 3, 3, 4)


def not_quite_gelu(bb, x):
    """x * (erf(x / 2) + 1) * 0.5: the shape of erf GELU, but not GELU."""
    y = bb.emit(R.matmul(x, relax.const(uniform(8, 8))))
    e = bb.emit(R.add(bb.emit(R.erf(bb.emit(R.divide(y, relax.const(2.0, F))))), relax.const(1.0, F)))
    return R.multiply(bb.emit(R.multiply(y, e)), relax.const(0.5, F))


@pytest.mark.parametrize(
    "make, shapes, dtype, refused_pattern",
    [
        (lambda bb, x: R.nn.conv2d(x, relax.const(W_NHWC), data_layout="NHWC", kernel_layout="OHWI"), [(1, 9, 9, 4)], F, "dnnl.conv2d"),
        (lambda bb, x: R.add(bb.emit(R.nn.conv2d(x, relax.const(W8))), relax.const(uniform(7))), [(1, 4, 9, 9)], F, "dnnl.conv2d_bias"),
        (lambda bb, x: R.matmul(x, relax.const(uniform(8, 8).astype("float16"))), [(2, 8)], "float16", "dnnl.dense"),
        (lambda bb, x: R.nn.max_pool2d(x, (3, 3), strides=(2, 2), ceil_mode=True), [(1, 4, 8, 8)], F, "dnnl.max_pool2d"),
        (
            lambda bb, x: R.nn.layer_norm(x, relax.const(uniform(5, 8)), relax.const(uniform(5, 8)), axes=[-2, -1]),
            [(2, 5, 8)],
            F,
            "dnnl.layer_norm",
        ),
        (not_quite_gelu, [(2, 8)], F, "dnnl.dense_gelu"),
    ],
    ids=["nhwc-conv", "bias-on-the-wrong-axis", "float16", "ceil-mode-window", "two-axis-layer-norm", "gelu-with-another-constant"],
)
def test_checks_refuse_what_the_kernels_cannot_compute(make, shapes, dtype, refused_pattern):
    assert refused_pattern in refused(make, *shapes, dtype=dtype)


def test_intermediate_result_read_outside_the_group_is_refused():
    def make(bb, x):
        conv = bb.emit(R.nn.conv2d(x, relax.const(W8)))
        relu = bb.emit(R.nn.relu(conv))
        return R.add(relu, conv)

    assert "dnnl.conv2d_relu" in refused(make, (1, 4, 9, 9))


def test_collage_lower_partitions_replaces_the_body_by_one_kernel_call(pm, backends):
    def make(bb, x):
        return R.nn.relu(bb.emit(R.nn.conv2d(x, relax.const(W8), padding=1)))

    mod = module(make, (1, 4, 9, 9))
    graph, candidate = whole_candidate(mod, "conv2d_relu")
    placed = partition_module(graph, [candidate])
    lowered = lower_partitions(pm, placed, backends, TARGET)
    partition = [gv for gv in lowered.get_global_vars() if gv.name_hint.startswith("collage_dnnl")][0]
    text = lowered[partition].script()
    assert text.count("R.call_dps_packed") == 1 and lowering.RUN_FUNCTION in text and "R.nn.conv2d" not in text


def test_weights_in_another_layout_are_reordered_not_misread(pm, backends):
    """A spec whose weights are not in the layout this CPU's primitive reads (as when a library
    built on another CPU runs here) still computes the convolution: the kernel reorders them."""
    mod = module(lambda bb, x: R.nn.conv2d(x, relax.const(W8), padding=1), (1, 4, 9, 9))
    graph, candidate = whole_candidate(mod, "conv2d")
    spec = specs.recognize(specs.Group.from_function(graph.region_function(candidate.nodes)[0]))
    library.load()
    packed = lowering._with_packed_weights(spec)
    assert packed.words[-1 - int(tvm.get_global_func("collage_dnnl.descriptor_words")())] == 1  # a layout is stored
    assert packed.words[: len(spec.words) - 1] == spec.words[:-1]
    # The unpacked spec says "plain OIHW weights"; this CPU's primitive wants another layout.
    x, out = uniform(1, 4, 9, 9), tvm_compat.to_tensor(np.zeros((1, 8, 9, 9), F), DEVICE)
    run = tvm.get_global_func(lowering.RUN_FUNCTION)
    run(tvm_compat.to_tensor(spec.array(), DEVICE), tvm_compat.to_tensor(x, DEVICE), tvm_compat.to_tensor(W8, DEVICE), out)
    np.testing.assert_allclose(tvm_compat.to_numpy(out), np_conv2d(x, W8, padding=(1, 1, 1, 1)), rtol=1e-4, atol=1e-4)


def test_mixed_placement_runs_dnnl_and_tvm_in_one_executable(pm, backends):
    def make(bb, x):
        conv = bb.emit(R.nn.relu(bb.emit(R.nn.conv2d(x, relax.const(W8), padding=1))))
        return R.multiply(bb.emit(R.sigmoid(conv)), conv)

    mod = module(make, (1, 4, 9, 9))
    graph = RelaxGraph.from_function(mod["main"])
    parts = [SimpleNamespace(backend="dnnl", pattern="dnnl.conv2d_relu", nodes=frozenset({0, 1}))]
    parts += [SimpleNamespace(backend="tvm", pattern="tvm.op", nodes=frozenset({n})) for n in (2, 3)]
    executable = build(pm, partition_module(graph, parts), backends, TARGET)
    x = uniform(1, 4, 9, 9)
    vm = relax.VirtualMachine(executable, DEVICE)
    actual = tvm_compat.to_numpy(vm["main"](tvm_compat.to_tensor(x, DEVICE)))
    conv = np.maximum(np_conv2d(x, W8, padding=(1, 1, 1, 1)), 0)
    np.testing.assert_allclose(actual, conv / (1 + np.exp(-conv)), rtol=1e-4, atol=1e-4)


def test_kernel_library_loads_in_a_fresh_process_and_reports_its_onednn():
    code = "import tvm; from collage_dnnl import library; library.load();print(tvm.get_global_func('collage_dnnl.onednn_version')())"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == library.find_onednn().version


def test_a_convolution_builds_the_same_kernel_every_time_on_one_machine(pm, backends, tmp_path, monkeypatch):
    """The layout chosen by timing at the first build is kept, so replays and exports rebuild the same kernel."""
    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path))
    mod = module(lambda bb, x: R.nn.conv2d(x, relax.const(W8), padding=1), (1, 4, 9, 9))
    graph, candidate = whole_candidate(mod, "conv2d")
    func = graph.region_function(candidate.nodes)[0]
    first = lowering.lower_function(func, "collage_dnnl_0").script(show_meta=True)
    chosen = json.loads((tmp_path / "dnnl" / "layout_choices.json").read_text())
    assert len(chosen) == 1 and list(chosen.values())[0] in (specs.PLAIN_ACTIVATIONS, specs.BLOCKED_ACTIVATIONS)
    # Whatever timing would say now, the kept choice decides.
    monkeypatch.setattr(lowering, "_seconds_per_run", lambda variant, shape: pytest.fail("timed again"))
    assert lowering.lower_function(func, "collage_dnnl_0").script(show_meta=True) == first
