"""The Relax-to-PyTorch converter, operator by operator: each case of
``collage_core.kit.testing.operator_cases`` converted and run by PyTorch, compared with TVM's own
build (the cases say how closely), and each refusal refused. The converted programs run eagerly
here; ``test_inductor_hooks`` runs them compiled by inductor."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from collage_inductor import relax_to_torch
from tvm import relax

from collage_core.kit import engine_operators
from collage_core.kit.testing.operator_cases import CASES, REFUSED, F, R, assert_same, function, pool_configurations, random_input, run_tvm


def run_torch(func, arrays):
    results = relax_to_torch.convert(func)(*[torch.from_numpy(array) for array in arrays])
    return [result.numpy() for result in results]


@pytest.mark.parametrize("make, specs, kind", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_operator_matches_tvm(make, specs, kind):
    func = function(make, *specs)
    rng = np.random.default_rng(1)
    arrays = [random_input(shape, dtype, rng, kind) for shape, dtype in specs]
    assert_same(run_torch(func, arrays), run_tvm(func, arrays))


def test_every_operator_has_a_converter():
    assert set(relax_to_torch.CONVERTERS) == set(engine_operators.SUPPORTED_OPS)


def test_pooling_is_refused_or_matches_tvm():
    accepted = 0
    for config in pool_configurations(60):
        op, size = config.pop("op"), config.pop("size")
        func = function(lambda x: op(x, **config), ((1, 2, *size), F))
        if relax_to_torch.refusal(func.body.blocks[0].bindings[0].value) is not None:
            continue
        accepted += 1
        data = random_input((1, 2, *size), F, np.random.default_rng(accepted))
        assert_same(run_torch(func, [data]), run_tvm(func, [data]))
    assert accepted >= 40


@pytest.mark.parametrize("make, specs, reason", [case[1:] for case in REFUSED], ids=[case[0] for case in REFUSED])
def test_what_the_onnx_converter_refuses_is_refused_too(make, specs, reason):
    func = function(make, *specs)
    with pytest.raises(relax_to_torch.UnsupportedError, match=reason):
        relax_to_torch.convert(func)


def test_constants_become_buffers_and_export_keeps_them():
    weight = np.arange(6, dtype=F).reshape(3, 2)
    func = function(lambda x: R.matmul(x, relax.const(weight)), ((4, 3), F))
    program = relax_to_torch.convert(func)
    np.testing.assert_array_equal(dict(program.named_buffers())["constant_0"].numpy(), weight)
    exported = relax_to_torch.exported(func)
    x = np.random.default_rng(0).uniform(size=(4, 3)).astype(F)
    np.testing.assert_allclose(exported.module()(torch.from_numpy(x))[0].numpy(), x @ weight, rtol=1e-6)
