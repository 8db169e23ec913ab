"""Token ids past the vocabulary: TVM's ``take`` reads its indices unchecked, so a library would read a wrong row or
fault where ONNX Runtime and PyTorch raise. The range each integer input may take is found in the model, and a call
outside it is refused in one line, in this process and from a loaded Model Library Format tar."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from tvm import relax

from collage_core.model.model_import import load_model
from collage_core.outputs.index_ranges import IndexOutOfRange, IndexRange, check_index_ranges, index_ranges
from collage_core.outputs.mlf import load_mlf
from collage_core.outputs.mlf_export import export_mlf

MODELS = Path(__file__).resolve().parents[1] / "models"
BERT = MODELS / "tiny_bert.onnx"  # 1,000 token ids, 16 a call


def test_the_token_ids_of_an_onnx_encoder_may_take_minus_the_vocabulary_up_to_it_and_an_image_has_none():
    # ONNX's Gather takes negative indices from the end: the importer's where(i < 0, i + 1000, i) says so
    assert index_ranges(load_model(str(BERT)).mod) == (IndexRange(0, "input_ids", -1000, 1000),)
    assert index_ranges(load_model(str(MODELS / "tiny_resnet.onnx")).mod) == ()


def _module(body):
    """main(ids: int64[4], other: int64[4]) -> float32 with ``body(bb, ids, other)`` as its dataflow."""
    bb = relax.BlockBuilder()
    ids, other = relax.Var("ids", relax.TensorType((4,), "int64")), relax.Var("other", relax.TensorType((4,), "int64"))
    with bb.function("main", [ids, other]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, ids, other))
        bb.emit_func_output(out)
    return bb.get()


def _table(rows: int):
    return relax.const(np.zeros((rows, 3), "float32"))


def test_ids_taken_as_they_are_may_not_be_negative_and_the_smallest_table_bounds_them():
    def body(bb, ids, other):
        flat = bb.emit(relax.op.reshape(relax.op.astype(ids, "int32"), (2, 2)))
        small = bb.emit(relax.op.take(_table(7), flat, axis=0))
        large = bb.emit(relax.op.take(_table(50), ids, axis=0))
        shifted = bb.emit(relax.op.add(other, relax.const(3, "int64")))  # not the input's values: not bounded
        return relax.op.add(relax.op.sum(small), relax.op.add(relax.op.sum(large), relax.op.sum(relax.op.take(_table(2), shifted, axis=0))))

    assert index_ranges(_module(body)) == (IndexRange(0, "ids", 0, 7),)


def test_a_call_outside_the_range_is_refused_in_one_line_naming_the_input_the_value_and_where():
    ranges = [IndexRange(0, "input_ids", -1000, 1000)]
    check_index_ranges(ranges, [np.array([[0, 999, -1000, -1]])])
    with pytest.raises(IndexOutOfRange) as refused:
        check_index_ranges(ranges, [np.array([[0, 1, 1000, 5]])])
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("input input_ids: 1000 at [0, 2] is outside [-1000, 1000)") and "nothing was run" in message


def test_the_library_refuses_a_token_id_past_the_vocabulary_and_runs_the_ones_onnx_runtime_takes(tiny_bert_on_tvm):
    result, _ = tiny_bert_on_tvm
    session = onnxruntime.InferenceSession(str(BERT), providers=["CPUExecutionProvider"])
    ids = np.arange(-8, 8, dtype=np.int64).reshape(1, 16) * 124  # -992 ... 868, negatives from the end
    expected = session.run(None, {"input_ids": ids})[0]
    np.testing.assert_allclose(result.run(ids)[0], expected, rtol=1e-3, atol=1e-4)
    far = ids.copy()
    far[0, 3] = 1 << 40  # would fault in TVM's kernel
    with pytest.raises(IndexOutOfRange, match=r"input input_ids: 1099511627776 at \[0, 3\]"):
        result.run(far)
    with pytest.raises(Exception):  # ONNX Runtime refuses it too
        session.run(None, {"input_ids": far})


def test_a_loaded_tar_carries_the_ranges_and_refuses_the_same_call(tiny_bert_on_tvm):
    result, folder = tiny_bert_on_tvm
    loaded = load_mlf(export_mlf(result, folder / "bert.tar"), folder / "unpacked")
    assert loaded.executor_config["input_ranges"] == [{"input": 0, "name": "input_ids", "low": -1000, "high": 1000}]
    ids = np.ones((1, 16), np.int64)
    np.testing.assert_allclose(loaded.run(ids)[0], result.run(ids)[0], rtol=1e-5, atol=1e-6)
    ids[0, 0] = -1001
    with pytest.raises(IndexOutOfRange, match=r"-1001 at \[0, 0\] is outside \[-1000, 1000\)"):
        loaded.run(ids)
