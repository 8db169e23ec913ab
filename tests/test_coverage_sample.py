"""A sample of benchmarks/coverage.py: one transformers family through every input path.

The full table (benchmarks/COVERAGE.md, over 20 families) is the benchmark's; here BERT, built from a
small config with random weights, goes through the TorchScript and dynamo ONNX exporters and
torch.export, each to an op-level placement whose numerics pass (ONNX Runtime or PyTorch as the
reference, Collage's default tolerance). The three paths take 25-40 s each and run with --run-slow
(importing PyTorch modules and ONNX files has quick tests of its own in test_model_import and
test_optimize); the report's counting is in the default suite.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def coverage():
    from collage_core.backends import discover_backends
    from collage_core.plugins import get_plugin_manager

    infos = discover_backends(get_plugin_manager())
    if "dnnl" not in infos or not infos["dnnl"].availability.available:
        pytest.skip("the coverage runs place over TVM and DNNL; DNNL is not available here")
    spec = importlib.util.spec_from_file_location("coverage_benchmark", ROOT / "benchmarks" / "coverage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("torchscript-onnx", marks=pytest.mark.slow),
        pytest.param("dynamo-onnx", marks=pytest.mark.slow),
        pytest.param("torch.export", marks=pytest.mark.slow),
    ],
)
def test_bert_passes_every_stage_through_each_path(coverage, path, tmp_path):
    if path == "dynamo-onnx":
        pytest.importorskip("onnxscript")
    record = coverage.run_pair("bert", path, tmp_path)
    assert record["failed"] is None, record
    assert set(record["stages"]) == {"export", "import", "candidates, search, build"}
    assert record["candidates"] > 0 and sum(record["placed"].values()) == record["operators"]
    assert record["numerics"].startswith("numerics passed")


def test_the_report_counts_passes_and_names_each_failure(coverage, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    records = [
        {"family": "bert", "kind": "encoder-only text", "path": "torch.export", "failed": None},
        {
            "family": "bert",
            "kind": "encoder-only text",
            "path": "dynamo-onnx",
            "failed": "import",
            "error": "ModelImportError: m.onnx: TVM's ONNX importer cannot convert Pad node 'p' (...)",
        },
    ]
    for record in records:
        (raw / f"{record['family']}__{record['path']}.json").write_text(json.dumps(record))
    report = tmp_path / "COVERAGE.md"
    coverage.write_report(raw, ["bert"], ["dynamo-onnx", "torch.export"], "python benchmarks/coverage.py", report)
    text = report.read_text()
    assert "**1 of 2 model-path pairs pass numerics (50%).**" in text
    assert "| bert | encoder-only text | fails at import | pass |" in text
    assert "- bert via dynamo-onnx, at import: ModelImportError: m.onnx: TVM's ONNX importer cannot convert Pad node 'p'" in text
