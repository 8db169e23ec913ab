"""Each operator the ONNX converter takes, run by OpenVINO and compared with TVM's own build
(``collage_core.kit.testing.operator_cases`` gives the cases and how closely they must agree).
OpenVINO computes every one of them as Relax does, so the backend adds no refusal of its own."""

from __future__ import annotations

import numpy as np
import pytest
from collage_openvino import runtime

from collage_core.kit import engine_operators, relax_to_onnx
from collage_core.kit.testing.operator_cases import CASES, F, assert_same, function, pool_configurations, random_input, run_tvm


def run_openvino(func, arrays):
    model = runtime.core().read_model(model=relax_to_onnx.convert(func).SerializeToString(), weights=b"")
    compiled = runtime.core().compile_model(model, "CPU", runtime.compile_config(threads=1))
    results = compiled.create_infer_request().infer(arrays)
    return [np.asarray(results[output]) for output in compiled.outputs]


@pytest.mark.parametrize("make, specs, kind", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_operator_matches_tvm(make, specs, kind):
    func = function(make, *specs)
    rng = np.random.default_rng(1)
    arrays = [random_input(shape, dtype, rng, kind) for shape, dtype in specs]
    assert_same(run_openvino(func, arrays), run_tvm(func, arrays))


def test_pooling_the_converter_takes_matches_tvm():
    accepted = 0
    for config in pool_configurations(60):
        op, size = config.pop("op"), config.pop("size")
        func = function(lambda x: op(x, **config), ((1, 2, *size), F))
        if not engine_operators.supports(func.body.blocks[0].bindings[0].value):
            continue
        accepted += 1
        data = random_input((1, 2, *size), F, np.random.default_rng(accepted))
        assert_same(run_openvino(func, [data]), run_tvm(func, [data]))
    assert accepted >= 40
