"""The kit's view readers: an operand read in place through split parts, reshapes and transposes, and the strides a
kernel writes a result with so that the group's transposed and reshaped output comes out packed; checked against
numpy's own views of the same memory."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

from collage_core.kit import Group, Refused, viewed_operand, written_view
from collage_core.kit.testing import function_module

R = relax.op


def _group(make, *shapes) -> Group:
    return Group.from_function(function_module(make, *shapes)["main"])


def _read(memory: np.ndarray, dims, strides, offset=0) -> np.ndarray:
    flat = memory.ravel()
    return np.lib.stride_tricks.as_strided(flat[offset:], dims, [s * flat.itemsize for s in strides])


def group_params(group: Group):
    """The tensors from outside the group its calls read."""
    return [arg for call in group.calls for arg in call.args if isinstance(arg, relax.Var) and group.producer(arg) is None]


@pytest.mark.parametrize("part, axes", [(0, [0, 2, 1, 3]), (1, [0, 2, 3, 1]), (2, [0, 2, 1, 3])])
def test_a_part_of_a_split_read_through_a_head_split_and_a_transpose_is_an_offset_and_strides(part, axes):
    def make(bb, x):
        parts = bb.emit(R.split(x, indices_or_sections=[24, 48], axis=2))
        item = bb.emit(relax.TupleGetItem(parts, part))
        return R.permute_dims(bb.emit(R.reshape(item, (2, 5, 3, 8))), axes)

    group = _group(make, (2, 5, 72))
    operand, views = viewed_operand(group, group.outputs[0])
    x = np.arange(2 * 5 * 72, dtype=np.float32).reshape(2, 5, 72)
    expected = x[:, :, 24 * part : 24 * (part + 1)].reshape(2, 5, 3, 8).transpose(axes)
    assert operand.source.same_as(group_params(group)[0]) and len(views) == 3
    np.testing.assert_array_equal(_read(x, operand.dims, operand.strides, operand.offset), expected)


def test_a_reshape_that_would_copy_is_refused():
    def make(bb, x):  # merging the sequence and head axes of a transposed tensor needs a copy
        return R.reshape(bb.emit(R.permute_dims(x, [0, 2, 1, 3])), (2, 15, 8))

    group = _group(make, (2, 5, 3, 8))
    with pytest.raises(Refused, match="would copy"):
        viewed_operand(group, group.outputs[0])


def test_the_result_of_a_transpose_and_reshapes_is_written_through_strides_that_leave_the_output_packed():
    def make(bb, o):
        return R.reshape(bb.emit(R.reshape(bb.emit(R.permute_dims(o, [0, 2, 1, 3])), (2, 5, 24))), (10, 24))

    group = _group(make, (2, 3, 5, 8))
    value, strides, views = written_view(group, group.outputs[0])
    o = np.random.default_rng(0).standard_normal((2, 3, 5, 8)).astype(np.float32)
    memory = np.zeros(o.size, np.float32)
    _read(memory, o.shape, strides)[...] = o  # what a kernel writing o through those strides leaves
    np.testing.assert_array_equal(memory.reshape(10, 24), o.transpose(0, 2, 1, 3).reshape(10, 24))
    assert len(views) == 3 and value.same_as(group_params(group)[0])
