"""Two `collage optimize` processes sharing one cost database at the same time."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = re.compile(r"candidates: \d+ \((\d+) distinct\); measured (\d+) in [\d.]+ s, (\d+) from the cost database, (\d+) invalid")


def small_model(path: Path) -> Path:
    """Two dense layers and a softmax: a dozen candidates, so the two processes race over a few of them."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.1, name)
               for name, shape in (("w1", (64, 64)), ("b1", (64,)), ("w2", (64, 32)), ("b2", (32,)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["o"]),
             helper.make_node("Add", ["o", "b2"], ["ob"]), helper.make_node("Softmax", ["ob"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "two_dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_two_processes_share_a_cost_database_and_both_finish(tmp_path):
    db = tmp_path / "costs.sqlite"
    model = small_model(tmp_path / "two_dense.onnx")
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "collage_core.cli", "optimize", str(model), "--backends", "tvm", "--search", "op-level",
             "--no-compare", "--calibration-rounds", "0", "--cost-db", str(db), "--output", str(tmp_path / f"out{i}")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )
        for i in range(2)
    ]
    results = [run.communicate(timeout=900) for run in runs]
    for run, (stdout, stderr) in zip(runs, results):
        assert run.returncode == 0, stderr[-2000:]
        assert "numerics passed" in stdout
    summaries = [SUMMARY.search(stdout) for stdout, _ in results]
    distinct = int(summaries[0].group(1))
    assert all(int(s.group(4)) == 0 for s in summaries)
    with sqlite3.connect(db) as connection:
        stored = connection.execute("SELECT COUNT(*) FROM costs").fetchone()[0]
    assert stored == distinct  # every candidate once, whichever process measured it
    assert all(int(s.group(2)) + int(s.group(3)) == distinct for s in summaries)
