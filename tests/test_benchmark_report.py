"""The peers benchmark's report: every number from the raw files, ratios and geomeans computed, stopped runs shown."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import peers_report  # noqa: E402


def measured(ms: float, spread_ms: float = 0.5, repeats: int = 10) -> dict:
    return {"kind": "measured", "median_s": ms / 1e3, "spread_s": spread_ms / 1e3, "repeats": repeats}


def write_model(raw: Path, stem: str, collage_ms: float, ort_ms: float, eager_ms: float, dnnl_ms: float) -> None:
    directory = raw / stem
    directory.mkdir(parents=True)
    for peer, ms in (("onnxruntime default session", ort_ms), ("pytorch eager", eager_ms)):
        row = {k: v for k, v in measured(ms).items() if k != "kind"}
        peers_report.raw_file(directory, peer).write_text(json.dumps(row))
    cold = {
        "end_to_end": [
            {"name": "placement", "cost": measured(collage_ms), "operators_by_backend": {"dnnl": 40, "onnxruntime": 7}},
            {"name": "dnnl + tvm for the rest", "cost": measured(dnnl_ms), "operators_by_backend": {"dnnl": 40}},
            {"name": "tvm alone", "cost": {"kind": "invalid", "reason": "stopped: one run takes longer than 60 s"},
             "operators_by_backend": {"tvm": 47}},
        ],
        "candidates": 120, "measurement": {"measured": 90, "from_database": 0, "seconds": 30.0}, "search_s": 2.0,
        "wall_s": 300.0, "numerics": {"reference": "onnxruntime 1.32.0", "passed": True},
    }
    peers_report.raw_file(directory, "collage cold").write_text(json.dumps(cold))


@pytest.fixture
def report(tmp_path):
    raw = tmp_path / "raw"
    write_model(raw, "small_b1", collage_ms=10.0, ort_ms=20.0, eager_ms=40.0, dnnl_ms=12.5)
    write_model(raw, "small_b8", collage_ms=30.0, ort_ms=15.0, eager_ms=60.0, dnnl_ms=30.0)
    path = peers_report.write_report(raw, "python benchmarks/peers.py", tmp_path / "RESULTS.md", tmp_path / "results.png",
                                     machine_lines=["- CPU: test"])
    return path.read_text()


def test_geomeans_are_computed_from_the_raw_ratios(report):
    # Collage / ONNX Runtime: 0.5 and 2.0 -> 1.00; / best single backend (DNNL): 0.8 and 1.0 -> sqrt(0.8).
    geomean_row = next(line for line in report.splitlines() if line.startswith("| 2 model-batch pairs"))
    assert geomean_row == f"| 2 model-batch pairs | 1.00 | 1.00 | {math.sqrt(0.8):.2f} |"


def test_each_model_names_its_best_peer_and_single_backend(report):
    row = next(line for line in report.splitlines() if line.startswith("| small_b1 |"))
    assert "| 0.50 | onnxruntime default session | 0.50 | dnnl + tvm for the rest | 0.80 | dnnl 40, onnxruntime 7 |" in row
    assert "10.00 ± 0.50" in row


def test_a_stopped_baseline_is_shown_as_a_bound_not_a_number(report):
    assert "| tvm alone | > 60000 (stopped) |  |  |" in report


def test_search_cost_and_numerics_are_reported(report):
    assert "candidates 120, measured 90 (0 from the cost database) in 30 s" in report
    assert "numerics against onnxruntime 1.32.0: pass" in report


def test_the_chart_is_drawn_when_matplotlib_is_installed(report, tmp_path):
    pytest.importorskip("matplotlib")
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_contenders_timed_in_turns_are_the_headline(tmp_path):
    raw = tmp_path / "raw"
    write_model(raw, "small_b1", collage_ms=10.0, ort_ms=20.0, eager_ms=40.0, dnnl_ms=12.5)
    turns = {"contenders": {"onnxruntime default session": measured(8.0, repeats=100),
                            "pytorch eager": measured(30.0, repeats=20),
                            "collage library": measured(9.0, repeats=90)}, "processes": 2}
    for row in turns["contenders"].values():
        row.pop("kind")
    turns["contenders"]["collage library"]["process_medians_s"] = [9.5e-3, 8.5e-3]
    turns["contenders"]["onnxruntime default session"]["process_medians_s"] = [8.0e-3, 8.4e-3]
    peers_report.raw_file(raw / "small_b1", "interleaved").write_text(json.dumps(turns))
    report = peers_report.write_report(raw, "cmd", tmp_path / "R.md", tmp_path / "r.png", machine_lines=[]).read_text()
    row = next(line for line in report.splitlines() if line.startswith("| small_b1 |"))
    # Each contender timed by its fastest process: Collage 8.5 ms against ONNX Runtime's 8 ms, both in turns;
    # against DNNL from the optimizer's run: 10 / 12.5.
    assert row.startswith("| small_b1 | 8.50 ± 0.50 | 1.06 | onnxruntime default session | 1.06 | dnnl + tvm for the rest | 0.80 |")
    assert "| collage library |" not in report  # shown under Collage's name
    assert f"| {peers_report.COLLAGE} | 8.50 ± 0.50 | 90 | 1.00 | 9.50, 8.50 | 9.00 |" in report
    assert "| pytorch eager | 30.00 ± 0.50 | 20 | 3.53 |  |  |" in report  # no process medians kept: as measured
    assert "Timed in turns (`interleaved.py`, 2 processes per contender)" in report


def test_each_row_names_the_commit_of_the_collage_run_it_shows(tmp_path):
    """Rows measured at different commits are told apart: the cold run's commit where only it ran,
    the warm run's where its library was timed in turns."""
    raw = tmp_path / "raw"
    write_model(raw, "small_b1", collage_ms=10.0, ort_ms=20.0, eager_ms=40.0, dnnl_ms=12.5)
    write_model(raw, "small_b8", collage_ms=10.0, ort_ms=20.0, eager_ms=40.0, dnnl_ms=12.5)
    for stem, commit in (("small_b1", "aaa1111"), ("small_b8", "bbb2222")):
        cold = json.loads(peers_report.raw_file(raw / stem, "collage cold").read_text())
        peers_report.raw_file(raw / stem, "collage cold").write_text(json.dumps({**cold, "commit": commit}))
    peers_report.raw_file(raw / "small_b8", "collage warm").write_text(json.dumps({**cold, "commit": "ccc3333"}))
    turns = {"contenders": {"onnxruntime default session": measured(8.0), "collage library": measured(9.0)}}
    peers_report.raw_file(raw / "small_b8", "interleaved").write_text(json.dumps(turns))
    report = peers_report.write_report(raw, "cmd", tmp_path / "R.md", tmp_path / "r.png", machine_lines=[]).read_text()
    rows = {line.split(" | ")[0][2:]: line for line in report.splitlines() if line.startswith("| small_")}
    assert rows["small_b1"].endswith("| `aaa1111` |")
    assert rows["small_b8"].endswith("| `ccc3333` |")


def test_models_are_listed_by_batch_then_name_whatever_their_names(tmp_path):
    raw = tmp_path / "raw"
    for stem in ("vit_base_b8", "vit_base_b1", "bert_l12_b1_s128", "bert_l12_b8_s128"):
        write_model(raw, stem, collage_ms=10.0, ort_ms=20.0, eager_ms=40.0, dnnl_ms=12.5)
    text = peers_report.write_report(raw, "python benchmarks/peers.py", tmp_path / "RESULTS.md", tmp_path / "results.png",
                                     machine_lines=["- CPU: test"]).read_text()
    headings = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    assert headings == ["bert_l12_b1_s128", "vit_base_b1", "bert_l12_b8_s128", "vit_base_b8"]


@pytest.mark.parametrize("single_timed_ms, expected", [(12.0, "dnnl + tvm for the rest, in turns | 0.75 |"),
                                                       ([14.0, 12.0], "dnnl + tvm for the rest, in turns | 0.75 |"),
                                                       (None, "dnnl + tvm for the rest (Collage's own placement), in turns | 1.00 |")])
def test_the_best_single_backend_timed_in_turns_replaces_the_sequential_ratio(tmp_path, single_timed_ms, expected):
    """Timed in turns beside Collage (9 ms) its ratio is 9/12, not the sequential 10/12.5, with 12 ms its
    fastest process's median where each process's was kept; when it is Collage's own placement there is
    no second library and the ratio is 1."""
    raw = tmp_path / "raw"
    write_model(raw, "small_b1", collage_ms=10.0, ort_ms=20.0, eager_ms=40.0, dnnl_ms=12.5)
    contenders = {"onnxruntime default session": measured(8.0), "collage library": measured(9.0)}
    if isinstance(single_timed_ms, list):  # each process's median, all runs' median in between
        contenders["best single backend library"] = {**measured(13.0), "process_medians_s": [ms / 1e3 for ms in single_timed_ms]}
    elif single_timed_ms is not None:
        contenders["best single backend library"] = measured(single_timed_ms)
    turns = {"contenders": contenders, "single": "dnnl + tvm for the rest"}
    peers_report.raw_file(raw / "small_b1", "interleaved").write_text(json.dumps(turns))
    report = peers_report.write_report(raw, "cmd", tmp_path / "R.md", tmp_path / "r.png", machine_lines=[]).read_text()
    row = next(line for line in report.splitlines() if line.startswith("| small_b1 |"))
    assert expected in row


def test_the_optimizers_own_rows_timed_in_turns_are_not_baselines():
    assert peers_report.single_backend_row("onnxruntime + op-level placement for the rest") == "onnxruntime + op-level for the rest"
    assert peers_report.single_backend_row("onnxruntime + op-level placement for the rest, timed in turns") is None
    assert peers_report.single_backend_row("placement, timed in turns") is None


def test_the_charts_relative_speeds_come_only_from_contenders_timed_in_turns():
    """Ratios across minutes would mislead: only what was timed in the same turns as ONNX Runtime
    gets a speed relative to it."""
    turns = [{"onnxruntime default session": measured(8.0), "collage library": measured(10.0)},
             {"onnxruntime default session": measured(30.0), "collage library": measured(15.0),
              peers_report.SINGLE_IN_TURNS: measured(20.0)},
             {}]
    named = [{peers_report.COLLAGE if k == "collage library" else k: v for k, v in t.items()} for t in turns]
    speeds = peers_report.relative_speeds(named)
    assert speeds[peers_report.COLLAGE] == pytest.approx([0.8, 2.0, None]) and speeds[peers_report.COLLAGE][2] is None
    assert speeds[peers_report.SINGLE_IN_TURNS][1] == pytest.approx(1.5)
    assert speeds[peers_report.SINGLE_IN_TURNS][0] is None
    assert set(speeds) == {peers_report.COLLAGE, peers_report.ORT_PEER, peers_report.SINGLE_IN_TURNS}


def test_gpu_section_shows_collage_each_backend_alone_and_the_gpu_peers(tmp_path):
    import gpu_report

    raw = tmp_path / "raw-cuda"
    directory = raw / "resnet50_b1"
    directory.mkdir(parents=True)
    (raw / gpu_report.MACHINE_FILE).write_text(json.dumps({"gpu": "NVIDIA H200 (sm_90)", "driver": "580.1", "torch": "2.11",
                                                           "torch_cudnn": 91900, "backends": "cudnn 9.19"}))
    for peer, ms in (("pytorch eager (cuda)", 3.0), ("torch.compile (cuda)", 2.0), ("torch.compile reduce-overhead (cuda)", 1.8)):
        peers_report.raw_file(directory, peer).write_text(json.dumps({k: v for k, v in measured(ms).items() if k != "kind"}))
    cold = {
        "end_to_end": [
            {"name": "placement", "cost": measured(2.5), "operators_by_backend": {"cudnn": 53, "tvm": 20}},
            {"name": "placement without CUDA graphs", "cost": measured(3.2), "operators_by_backend": {"cudnn": 53, "tvm": 20}},
            {"name": "cudnn + tvm for the rest", "cost": measured(2.6), "operators_by_backend": {"cudnn": 53, "tvm": 20}},
            {"name": "tvm alone", "cost": measured(5.0), "operators_by_backend": {"tvm": 73}},
            {"name": "unpartitioned relax.build", "cost": {"kind": "invalid", "reason": "build failed"}, "operators_by_backend": {}},
            {"name": "cudnn + tvm for the rest, timed in turns", "cost": measured(2.7), "operators_by_backend": {"cudnn": 53, "tvm": 20}},
        ],
        "wall_s": 200.0, "numerics": {"passed": True}, "commit": "abc1234",
    }
    peers_report.raw_file(directory, "collage cold").write_text(json.dumps(cold))
    report = tmp_path / "RESULTS.md"
    report.write_text("# CPU tables\n")
    gpu_report.append_gpu_section(raw, report, tmp_path / "results-cuda.png")
    text = report.read_text()
    assert text.startswith("# CPU tables") and "NVIDIA H200 (sm_90)" in text
    row = next(line for line in text.splitlines() if line.startswith("| resnet50_b1 | 2.500"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[2] == "3.200"  # the same placement launching kernel by kernel
    assert cells[3] == "2.700"  # the returned library, one call at a time
    assert cells[4] == "cudnn 53, tvm 20"
    assert cells[5] == "cudnn + tvm for the rest (2.600)" and cells[6] == "0.96"  # 2.5 / 2.6
    assert cells[7:10] == ["3.000", "2.000", "1.800"]
    assert cells[10:12] == ["0.90", "1.50"]  # per call 2.7 against eager 3.0 and the best torch.compile mode, 1.8
    assert cells[12] == "passed"


def test_openvino_is_a_peer_and_its_single_backend_rows_are_baselines(tmp_path):
    raw = tmp_path / "raw"
    write_model(raw, "small_b1", collage_ms=10.0, ort_ms=20.0, eager_ms=40.0, dnnl_ms=12.5)
    row = {k: v for k, v in measured(16.0).items() if k != "kind"}
    peers_report.raw_file(raw / "small_b1", peers_report.OPENVINO_PEER).write_text(json.dumps(row))
    path = peers_report.write_report(raw, "python benchmarks/peers.py", tmp_path / "RESULTS.md", tmp_path / "results.png",
                                     machine_lines=["- CPU: test"])
    line = next(line for line in path.read_text().splitlines() if line.startswith("| small_b1 |"))
    assert "| openvino default session (fp32) | 0.62 |" in line  # 10 ms against OpenVINO's 16, the best peer
    assert peers_report.single_backend_row("openvino + tvm for the rest") == "openvino + op-level for the rest"
    assert peers_report.single_backend_row("openvino alone") == "openvino alone"


def test_a_baseline_left_unbuilt_says_what_its_partitions_add_up_to():
    reason = ("not built: its partitions' measured costs add up to 26934.980 ms, over 10x the op-level placement's "
              "117.540 ms")
    assert peers_report._format_ms({"error": reason}) == "not built: its partitions add up to 26934.980 ms"


def test_gpu_precision_runs_with_an_added_backend_get_their_own_row_beside_the_peers_at_their_precision():
    import precision

    assert precision.parse_run("fp16+cutlass", "tvm,cublas") == ("fp16", "", "tvm,cublas,cutlass")
    assert precision.parse_run("bf16@2e-3", "tvm,cublas") == ("bf16", "2e-3", "tvm,cublas")
    assert precision.parse_run("fp16+cublas", "tvm,cublas") == ("fp16", "", "tvm,cublas")  # named once
    assert precision.parse_run("tf32+cutlass", "tvm,cublas") == ("tf32", "", "tvm,cublas,cutlass")
    with pytest.raises(ValueError, match="'int8'"):
        precision.parse_run("int8", "tvm")

    def run(ms, mix):
        return {"results": {"end_to_end": [{"cost": {"median_s": ms / 1e3}, "operators_by_backend": mix}],
                            "numerics": {"max_rel_error": 1e-3}}, "wall_s": 100.0}

    record = {"model": "bert-base", "batch": 1, "backends": "tvm,cublas,cudnn",
              "collage": {"fp16": run(1.0, {"cublas": 96, "tvm": 100}), "fp16+cutlass": run(0.8, {"cutlass": 60, "cublas": 36})},
              "peers": {"pytorch eager": {"fp16": {"median_s": 0.012, "error": 1e-3}},
                        "torch.compile reduce-overhead": {"fp16": {"median_s": 0.0016, "error": 1e-3}}}}
    rows = [line for line in precision.gpu_report([record]).splitlines() if line.startswith("| fp16")]
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    assert [c[0] for c in cells] == ["fp16", "fp16 + cutlass"]
    assert cells[1][1] == "0.800" and cells[1][3] == "cublas 36, cutlass 60" and cells[1][6] == "0.50"  # 0.8 / 1.6
    assert cells[0][6] == "0.62"
    lines = precision.gpu_report([record], about="One H200, two leases.\n").splitlines()
    assert lines[:4] == [lines[0], "", "One H200, two leases.", ""] and lines[4].startswith("Command:")
    assert precision.gpu_report([record]).splitlines()[2].startswith("Command:")
    titled = precision.gpu_report([record], about="# fp16 on one H200\n\nTwo leases.").splitlines()
    assert titled[:4] == ["# fp16 on one H200", "", "Two leases.", ""]


def test_measuring_the_gpu_peers_at_another_precision_keeps_the_ones_measured_before(tmp_path, monkeypatch):
    """A run asking for tf32 where the raw record already holds the peers at fp32 adds tf32 beside them (the
    peers' process is replaced here by one answering tf32 alone; Collage's run is not made)."""
    import subprocess as real_subprocess
    import types

    import precision

    stem = precision._stem("resnet50", 8)
    fp32 = {"median_s": 0.004, "error": 0.0}
    (tmp_path / f"{stem}.json").write_text(json.dumps({
        "model": "resnet50", "batch": 8, "backends": "tvm,cublas,cudnn", "collage": {"tf32": {"wall_s": 1.0}},
        "peers": {mode: {"fp32": fp32} for mode in precision.GPU_MODES}}))
    monkeypatch.setattr(precision, "_onnx_file", lambda name, batch: tmp_path / "model.onnx")
    answered = json.dumps({"tf32": {"median_s": 0.001, "error": 5e-4}})
    monkeypatch.setattr(precision, "subprocess", types.SimpleNamespace(
        run=lambda *args, **kwargs: real_subprocess.CompletedProcess(args, 0, stdout=answered + "\n", stderr="")))
    record = precision.measure_on_gpu("resnet50", 8, "tvm,cublas,cudnn", tmp_path, precisions=("tf32",))
    for mode in precision.GPU_MODES:
        assert record["peers"][mode] == {"fp32": fp32, "tf32": {"median_s": 0.001, "error": 5e-4}}
    assert json.loads((tmp_path / f"{stem}.json").read_text())["peers"] == record["peers"]
