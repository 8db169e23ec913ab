"""Pooling, resizing and padding as the inductor runtime runs them: the converted program exported by
``torch.export`` (its weights, indices and divisors as constants), saved and loaded as a lowered partition
carries it, and compiled by AOTInductor; compared with TVM's own build as ``operator_cases`` says."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from collage_inductor import relax_to_torch, runtime

from collage_core.kit import engine_lowering
from collage_core.kit.testing.operator_cases import CASES, NCHW4, F, R, assert_same, function, random_input, run_tvm

EXPORTED = [case for case in CASES if case[0].startswith(("max_pool2d", "avg_pool2d", "resize2d", "pad_"))]


def saved_and_loaded(func):
    buffer = io.BytesIO()
    torch.export.save(relax_to_torch.exported(func), buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("make, specs, kind", [case[1:] for case in EXPORTED], ids=[case[0] for case in EXPORTED])
def test_exported_program_matches_tvm(make, specs, kind):
    func = function(make, *specs)
    arrays = [random_input(shape, dtype, np.random.default_rng(1), kind) for shape, dtype in specs]
    program = torch.export.load(io.BytesIO(saved_and_loaded(func)))
    results = program.module()(*[torch.from_numpy(array) for array in arrays])
    assert_same([result.numpy() for result in results], run_tvm(func, arrays))


@pytest.mark.slow
def test_compiled_by_inductor_matches_tvm(tmp_path, monkeypatch):
    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path))
    func = function(
        lambda x: [
            R.image.resize2d(x, (13, 17), method="cubic"),
            R.image.resize2d(x, (18, 20), method="nearest_neighbor", coordinate_transformation_mode="asymmetric", rounding_method="floor"),
            R.nn.pad(x, [0, 0, 1, 0, 2, 1, 0, 3], pad_mode="reflect"),
            R.nn.avg_pool2d(x, 3, strides=2, padding=(1, 0, 2, 1), ceil_mode=True, count_include_pad=True),
            R.nn.avg_pool2d(x, 12, strides=12, ceil_mode=True, count_include_pad=True),
        ],
        NCHW4,
    )
    x = random_input(NCHW4[0], F, np.random.default_rng(2))
    serialized = saved_and_loaded(func)
    key = runtime.key_of(engine_lowering.pack_blob(serialized))
    compiled = runtime._compile(key, lambda: serialized, (runtime.CPU, 0)).compiled
    with torch.inference_mode():
        results = compiled(torch.from_numpy(x))
    assert_same([result.numpy() for result in results], run_tvm(func, [x]))
