"""benchmarks/converter_coverage.py's counting and report, on a small module and on made-up raw records (the full
table, benchmarks/CONVERTER-COVERAGE.md, imports over 20 transformers families and is the benchmark's)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from tvm import relax, topi

from collage_core.relax_onnx.operator_cases import F, R

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("collage_inductor")


@pytest.fixture(scope="module")
def coverage_script():
    spec = importlib.util.spec_from_file_location("converter_coverage", ROOT / "benchmarks" / "converter_coverage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_census_counts_what_each_converter_takes_and_names_the_kernels(coverage_script):
    x = relax.Var("x", relax.TensorType((1, 3, 5, 6), F))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            padded = bb.emit_te(topi.nn.pad, x, [0, 0, 1, 1], [0, 0, 1, 1], -1.0)
            resized = bb.emit(R.image.resize2d(padded, (14, 16)))
            output = bb.emit_output(R.cumsum(resized, axis=3))
        bb.emit_func_output(output)
    counted = coverage_script.census(bb.get())
    assert counted["operators"] == 3 and counted["call_tir_callees"] == {"pad": 1}
    for name in ("onnx", "inductor"):
        assert counted[name]["taken"] == 1
        assert sorted(counted[name]["refused"]) == [
            "relax.call_tir of pad (a TIR function, not an operator) has no ONNX conversion",
            "relax.cumsum has no ONNX conversion",
        ]


def test_reasons_are_grouped_without_the_numbers_that_vary(coverage_script):
    assert (
        coverage_script.reason_group("relax.call_tir of pad12 (a TIR function) has no ONNX conversion")
        == "relax.call_tir of pad (a TIR function) has no ONNX conversion"
    )
    assert (
        coverage_script.reason_group("nearest resize 5 -> 16 (asymmetric) whose source coordinate 2.5 is a boundary")
        == "nearest resize N -> N (asymmetric) whose source coordinate N is a boundary"
    )
    assert coverage_script.reason_group("relax.astype on int8") == "relax.astype on int8"


def test_report_sums_the_pairs_and_shows_what_the_rewrites_remove(coverage_script, tmp_path):
    def census(operators, onnx_refused):
        refused = {"relax.call_tir of pad (a TIR function, not an operator) has no ONNX conversion": onnx_refused}
        taken = {"taken": operators - onnx_refused, "refused": refused if onnx_refused else {}}
        return {
            "operators": operators,
            "by_operator": {},
            "onnx": taken,
            "inductor": taken,
            "call_tir_callees": {"pad": onnx_refused} if onnx_refused else {},
        }

    (tmp_path / "efficientnet__torchscript-onnx.json").write_text(
        json.dumps(
            {
                "family": "efficientnet",
                "kind": "convolutional",
                "path": "torchscript-onnx",
                "failed": None,
                "as_imported": census(10, 4),
                "rewritten": census(8, 0),
            }
        )
    )
    (tmp_path / "llama__torchscript-onnx.json").write_text(
        json.dumps({"family": "llama", "path": "torchscript-onnx", "failed": "AssertionError: not implemented"})
    )
    report = tmp_path / "report.md"
    coverage_script.write_report(tmp_path, ["efficientnet", "llama"], ["torchscript-onnx"], "command", report)
    text = report.read_text()
    assert (
        "**1 model-path pairs, 10 operator calls as imported: the ONNX converter takes 6/10 (60%), the PyTorch "
        "converter 6/10 (60%). After the rewrites (8 calls): ONNX 8/8 (100%), PyTorch 8/8 (100%).**"
    ) in text
    assert "| efficientnet | torchscript-onnx | 10 | 6/10 (60%) | 6/10 (60%) | 8 | 8/8 (100%) | 8/8 (100%) | pad ×4 |" in text
    assert "- 4 -> 0 × relax.call_tir of pad (a TIR function, not an operator) has no ONNX conversion (efficientnet)" in text
    assert "The PyTorch converter refuses the same calls for the same reasons" in text
    assert "- llama via torchscript-onnx: AssertionError: not implemented" in text
