"""A PyTorch module optimized for several shapes: exported with the listed dimensions symbolic, checked, and
answered by one library (the module is the reference: float32 within rtol 1e-4, atol 1e-5)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from shape_runs import QUICK, optimized_for_shapes

import collage_core
from collage_core.model.shape_profiles import ShapeProfileError, symbolic_inputs
from collage_core.model.torch_shapes import exported_for_shapes
from collage_core.outputs.profiled_result import PLACEMENTS_FILE

RTOL, ATOL = 1e-4, 1e-5


class MaskedPool(torch.nn.Module):
    """Features of a batch of sequences, averaged over the positions a mask keeps, then projected."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.project = torch.nn.Linear(8, 4)

    def forward(self, features, mask):
        kept = mask.unsqueeze(-1).to(features.dtype)
        return self.project((features * kept).sum(1) / kept.sum(1).clamp(min=1.0))


def example():
    return torch.randn(2, 6, 8), torch.ones(2, 6, dtype=torch.int64)


def test_axes_that_vary_become_dimensions_shared_by_the_inputs_whose_sizes_agree():
    proto = exported_for_shapes(MaskedPool(), example(), "features=1x4x8,4x16x8 mask=1x4,4x16")
    dims = {spec.name: spec.dims for spec in symbolic_inputs(proto)}
    assert dims == {"features": ("features.0", "features.1", 8), "mask": ("features.0", "features.1")}
    assert proto.graph.name == "MaskedPool"


@pytest.mark.parametrize(
    "text, says",
    [
        ("batch=1,4", "PyTorch module MaskedPool: --shapes: 'batch' is neither"),
        ("features=1x4x8,4x16x8", "no input listed binds"),
        ("features=2x6x8 mask=2x6", "every shape listed is the example's"),
        ("features=1x4,4x16 mask=1x4,4x16", "features is [features.0, features.1, features.2], rank 3; 1x4 is not"),
    ],
)
def test_shapes_a_module_cannot_take_are_refused_in_one_line(text, says):
    with pytest.raises(ShapeProfileError) as refused:
        exported_for_shapes(MaskedPool(), example(), text)
    assert says in str(refused.value) and "\n" not in str(refused.value)


class ShapeBranch(torch.nn.Module):
    def forward(self, x):
        return x * 2 if x.shape[0] > 2 else x  # a trace keeps the example's branch


def test_an_export_that_does_not_compute_what_the_module_does_is_refused():
    with pytest.raises(ShapeProfileError, match="its ONNX export does not compute what it does at x=1x3"):
        exported_for_shapes(ShapeBranch(), (torch.randn(4, 3),), "x=1x3,4x3")


class Unused(torch.nn.Module):
    def forward(self, x, ignored):
        return x + 1


class Dropped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(x) * 2


class FixedRows(torch.nn.Module):
    def forward(self, x):
        return x.reshape(4, 6)  # only a batch of 4 fits


def test_an_input_forward_ignores_a_module_in_training_mode_and_a_shape_it_cannot_take_are_each_said_in_one_line(caplog):
    with pytest.raises(ShapeProfileError, match="forward does not use its input\\(s\\) ignored, which the export drops"):
        exported_for_shapes(Unused(), (torch.randn(2, 3), torch.randn(2, 3)), "x=1x3,4x3 ignored=1x3,4x3")
    trained = Dropped().train()
    with caplog.at_level(logging.WARNING, logger="collage"):
        assert exported_for_shapes(trained, (torch.randn(2, 3),), "x=1x3,4x3") is not None  # checked as exported: eval
    assert trained.training and all(child.training for child in trained.modules())  # given back as it came, and said so
    assert any(r.getMessage().startswith("model Dropped: the module is in training mode") for r in caplog.records)
    with pytest.raises(ShapeProfileError) as refused:
        exported_for_shapes(FixedRows(), (torch.randn(4, 6),), "x=4x6,2x6")
    assert str(refused.value).startswith("PyTorch module FixedRows") and "x=2x6" in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.fixture(scope="module")
def optimized(tmp_path_factory):
    folder = tmp_path_factory.mktemp("torch-shapes") / "out"
    return optimized_for_shapes(MaskedPool(), "features=1x4x8,3x8x8 mask=1x4,3x8", folder, example_inputs=example()), folder


def test_one_library_answers_a_module_at_each_shape_and_padded_between_them(optimized):
    result, _ = optimized
    assert result.verified and [p.label for p in result.dispatch.profiles] == ["features.0=1 features.1=4", "features.0=3 features.1=8"]
    module, rng = MaskedPool(), np.random.default_rng(3)
    for batch, sequence in [(1, 4), (3, 8), (2, 5)]:  # the listed shapes, then one padded along both
        features = rng.standard_normal((batch, sequence, 8)).astype("float32")
        mask = (rng.random((batch, sequence)) > 0.3).astype("int64")
        (out,) = result.run(features, mask)
        with torch.no_grad():
            expected = module(torch.from_numpy(features), torch.from_numpy(mask)).numpy()
        np.testing.assert_allclose(out, expected, rtol=RTOL, atol=ATOL)


def test_a_modules_placements_replay_with_the_module(optimized, tmp_path):
    result, folder = optimized
    replayed = collage_core.optimize(
        MaskedPool(),
        example_inputs=example(),
        placement=folder / PLACEMENTS_FILE,
        output_dir=tmp_path / "replay",
        settings=QUICK,
        show_progress=False,
    )
    assert replayed.verified
    assert [s.placement.partitions for s in replayed.shapes] == [s.placement.partitions for s in result.shapes]
