"""A call of a built model with inputs it does not take (too few or too many, another type, another shape) is refused
in one line naming the input and what the model takes, before anything runs: by the library in this process and by
a loaded Model Library Format tar. TVM's virtual machine would refuse them deep in the call, in its own words."""

from __future__ import annotations

import numpy as np
import pytest

from collage_core.errors import CollageError
from collage_core.outputs.mlf import load_mlf
from collage_core.outputs.mlf_export import export_mlf
from collage_core.outputs.run_inputs import Expected, InputMismatch, checked_inputs


def test_the_first_input_that_is_not_what_the_model_takes_is_named_and_nothing_is_cast():
    expected = [Expected("ids", "int64", (1, 4)), Expected("scale", "float32")]
    ids, scale = np.zeros((1, 4), np.int64), np.ones((3,), np.float32)
    arrays = checked_inputs(expected, [ids, scale])
    assert arrays[0] is ids and arrays[1] is scale  # the caller's arrays, as they are
    assert checked_inputs(expected, [[[1, 2, 3, 4]], scale])[0].dtype == np.int64  # lists become arrays
    cases = [
        ([ids], "1 input given; the model takes 2: ids (int64 1x4), scale (float32); nothing was run"),
        ([ids, scale, scale], "3 inputs given; the model takes 2: ids (int64 1x4), scale (float32); nothing was run"),
        ([ids.astype(np.int32), scale], "input ids: int32 values where the model takes int64 (np.asarray(x, 'int64') casts them)"),
        ([ids, scale.astype(np.float64)], "input scale: float64 values where the model takes float32"),
        ([np.zeros((1, 5), np.int64), scale], "input ids: shape (1, 5) where the model takes (1, 4); nothing was run"),
    ]
    for inputs, said in cases:
        with pytest.raises(InputMismatch) as refused:
            checked_inputs(expected, inputs)
        assert said in str(refused.value) and "\n" not in str(refused.value)
        assert isinstance(refused.value, CollageError)


def test_a_tensor_that_requires_grad_is_read_for_its_values():
    """A PyTorch tensor taking part in autograd: numpy refuses to read it ("Can't call numpy() on Tensor that requires
    grad"); inference reads its values only, and the caller's tensor keeps its graph."""
    torch = pytest.importorskip("torch")
    weights = torch.ones(1, 4, requires_grad=True)
    (array,) = checked_inputs([Expected("x", "float32", (1, 4))], [weights * 2])
    np.testing.assert_array_equal(array, np.full((1, 4), 2, np.float32))
    assert weights.requires_grad


def test_the_library_and_its_tar_refuse_inputs_of_another_number_type_or_shape_and_run_the_right_ones(tiny_bert_on_tvm):
    result, folder = tiny_bert_on_tvm
    loaded = load_mlf(export_mlf(result, folder / "bert.tar"), folder / "unpacked")
    ids = np.arange(16, dtype=np.int64).reshape(1, 16)
    np.testing.assert_allclose(loaded.run(ids)[0], result.run(ids)[0], rtol=1e-5, atol=1e-6)
    for run in (result.run, loaded.run):
        with pytest.raises(InputMismatch, match=r"^0 inputs given; the model takes 1: input_ids \(int64 1x16\)"):
            run()
        with pytest.raises(InputMismatch, match=r"^2 inputs given"):
            run(ids, ids)
        with pytest.raises(InputMismatch, match="^input input_ids: int32 values where the model takes int64"):
            run(ids.astype(np.int32))
        with pytest.raises(InputMismatch, match=r"^input input_ids: shape \(1, 8\) where the model takes \(1, 16\)"):
            run(ids[:, :8])
