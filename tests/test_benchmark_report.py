"""The peers benchmark's report: every number from the raw files, ratios and geomeans computed, stopped runs shown."""

from __future__ import annotations

import json
import math
import os
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
            {
                "name": "tvm alone",
                "cost": {"kind": "invalid", "reason": "stopped: one run takes longer than 60 s"},
                "operators_by_backend": {"tvm": 47},
            },
        ],
        "candidates": 120,
        "measurement": {"measured": 90, "from_database": 0, "seconds": 30.0},
        "search_s": 2.0,
        "wall_s": 300.0,
        "numerics": {"reference": "onnxruntime 1.32.0", "passed": True},
    }
    peers_report.raw_file(directory, "collage cold").write_text(json.dumps(cold))


@pytest.fixture
def report(tmp_path):
    raw = tmp_path / "raw"
    write_model(raw, "small_b1", collage_ms=10.0, ort_ms=20.0, eager_ms=40.0, dnnl_ms=12.5)
    write_model(raw, "small_b8", collage_ms=30.0, ort_ms=15.0, eager_ms=60.0, dnnl_ms=30.0)
    path = peers_report.write_report(
        raw, "python benchmarks/peers.py", tmp_path / "RESULTS.md", tmp_path / "results.png", machine_lines=["- CPU: test"]
    )
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
    turns = {
        "contenders": {
            "onnxruntime default session": measured(8.0, repeats=100),
            "pytorch eager": measured(30.0, repeats=20),
            "collage library": measured(9.0, repeats=90),
        },
        "processes": 2,
    }
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
    text = peers_report.write_report(
        raw, "python benchmarks/peers.py", tmp_path / "RESULTS.md", tmp_path / "results.png", machine_lines=["- CPU: test"]
    ).read_text()
    headings = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    assert headings == ["bert_l12_b1_s128", "vit_base_b1", "bert_l12_b8_s128", "vit_base_b8"]


@pytest.mark.parametrize(
    "single_timed_ms, expected",
    [
        (12.0, "dnnl + tvm for the rest, in turns | 0.75 |"),
        ([14.0, 12.0], "dnnl + tvm for the rest, in turns | 0.75 |"),
        (None, "dnnl + tvm for the rest (Collage's own placement), in turns | 1.00 |"),
    ],
)
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
    turns = [
        {"onnxruntime default session": measured(8.0), "collage library": measured(10.0)},
        {"onnxruntime default session": measured(30.0), "collage library": measured(15.0), peers_report.SINGLE_IN_TURNS: measured(20.0)},
        {},
    ]
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
    (raw / gpu_report.MACHINE_FILE).write_text(
        json.dumps({"gpu": "NVIDIA H200 (sm_90)", "driver": "580.1", "torch": "2.11", "torch_cudnn": 91900, "backends": "cudnn 9.19"})
    )
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
        "wall_s": 200.0,
        "numerics": {"passed": True},
        "commit": "abc1234",
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
    path = peers_report.write_report(
        raw, "python benchmarks/peers.py", tmp_path / "RESULTS.md", tmp_path / "results.png", machine_lines=["- CPU: test"]
    )
    line = next(line for line in path.read_text().splitlines() if line.startswith("| small_b1 |"))
    assert "| openvino default session (fp32) | 0.62 |" in line  # 10 ms against OpenVINO's 16, the best peer
    assert peers_report.single_backend_row("openvino + tvm for the rest") == "openvino + op-level for the rest"
    assert peers_report.single_backend_row("openvino alone") == "openvino alone"


def test_a_baseline_left_unbuilt_says_what_its_partitions_add_up_to():
    reason = "not built: its partitions' measured costs add up to 26934.980 ms, over 10x the op-level placement's 117.540 ms"
    assert peers_report._format_ms({"error": reason}) == "not built: its partitions add up to 26934.980 ms"


def test_gpu_precision_runs_with_an_added_backend_get_their_own_row_beside_the_peers_at_their_precision():
    import precision

    assert precision.parse_run("fp16+cutlass", "tvm,cublas") == ("fp16", "", "tvm,cublas,cutlass")
    assert precision.parse_run("bf16@2e-3", "tvm,cublas") == ("bf16", "2e-3", "tvm,cublas")
    assert precision.parse_run("fp16+cublas", "tvm,cublas") == ("fp16", "", "tvm,cublas")  # named once
    assert precision.parse_run("tf32+cutlass", "tvm,cublas") == ("tf32", "", "tvm,cublas,cutlass")
    assert precision.parse_run("bf16/nhwc+cutlass", "tvm,cudnn") == ("bf16", "", "tvm,cudnn,cutlass")
    assert [precision.run_layout(spec) for spec in ("bf16/nhwc+cutlass", "bf16@2e-3", "fp16/nhwc", "bf16/model")] == [
        "nhwc",
        "",
        "nhwc",
        "model",
    ]
    assert precision.run_label("bf16/nhwc+cutlass") == "bf16, NHWC + cutlass"
    assert precision.run_label("bf16/model") == "bf16, model layout"
    with pytest.raises(ValueError, match="the layout after / is nhwc"):
        precision.run_layout("bf16/nchw4c")
    with pytest.raises(ValueError, match="'int8'"):
        precision.parse_run("int8", "tvm")

    def run(ms, mix):
        return {
            "results": {"end_to_end": [{"cost": {"median_s": ms / 1e3}, "operators_by_backend": mix}], "numerics": {"max_rel_error": 1e-3}},
            "wall_s": 100.0,
        }

    record = {
        "model": "bert-base",
        "batch": 1,
        "backends": "tvm,cublas,cudnn",
        "collage": {"fp16": run(1.0, {"cublas": 96, "tvm": 100}), "fp16+cutlass": run(0.8, {"cutlass": 60, "cublas": 36})},
        "peers": {
            "pytorch eager": {"fp16": {"median_s": 0.012, "error": 1e-3}},
            "torch.compile reduce-overhead": {"fp16": {"median_s": 0.0016, "error": 1e-3}},
        },
    }
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
    peers' processes are replaced here by one answering tf32; Collage's run is not made)."""
    import precision

    stem = precision._stem("resnet50", 8)
    fp32 = {"median_s": 0.004, "error": 0.0}
    (tmp_path / f"{stem}.json").write_text(
        json.dumps(
            {
                "model": "resnet50",
                "batch": 8,
                "backends": "tvm,cublas,cudnn",
                "collage": {"tf32": {"wall_s": 1.0}},
                "peers": {mode: {"fp32": fp32} for mode in precision.DEFAULT_GPU_MODES},
            }
        )
    )
    asked = []

    def run_peer(name, batch, mode, precision_, timeout_s, device="cuda"):
        asked.append((mode, precision_))
        return {"median_s": 0.001, "error": 5e-4}

    monkeypatch.setattr(precision, "run_peer", run_peer)
    record = precision.measure_on_gpu("resnet50", 8, "tvm,cublas,cudnn", tmp_path, precisions=("tf32",))
    assert asked == [(mode, "tf32") for mode in precision.DEFAULT_GPU_MODES]
    for mode in precision.DEFAULT_GPU_MODES:
        assert record["peers"][mode] == {"fp32": fp32, "tf32": {"median_s": 0.001, "error": 5e-4}}
    assert json.loads((tmp_path / f"{stem}.json").read_text())["peers"] == record["peers"]


def _gpu_run(ms: float, mix: dict, tflops: float = 0.0, fraction: float | None = None) -> dict:
    """A Collage run as precision.py keeps it: its results.json, with the throughput its report gives."""
    throughput = {
        "flops": int(tflops * 1e12 * ms / 1e3),
        "tflops": tflops,
        "fraction_of_peak": fraction,
        "device": "cuda:sm_90a (NVIDIA H200, compute capability 9.0, CUDA 13.0)",
        "peak": {
            "gpu": "H200",
            "precision": "fp32",
            "tflops": 67.0,
            "source": "NVIDIA H200 Tensor Core GPU datasheet",
            "url": "https://www.nvidia.com/en-us/data-center/h200/",
        },
    }
    return {
        "results": {
            "end_to_end": [{"name": "placement", "cost": {"median_s": ms / 1e3}, "operators_by_backend": mix}],
            "numerics": {"max_rel_error": 1e-6},
            "throughput": throughput,
        },
        "wall_s": 120.0,
    }


def _peer_ms(ms: float, compile_s: float = 30.0) -> dict:
    return {"median_s": ms / 1e3, "spread_s": 1e-5, "repeats": 50, "compile_s": compile_s, "error": 1e-6}


def _torch_compile_records() -> list[dict]:
    import precision

    eager, default, reduced, autotuned, autotuned_alone = precision.GPU_MODES
    resnet = {
        "model": "resnet50",
        "batch": 1,
        "backends": "tvm,cublas,cudnn",
        "collage": {"fp32": _gpu_run(2.0, {"cudnn": 139, "tvm": 37}, tflops=4.1, fraction=0.0612)},
        "peers": {
            eager: {"fp32": _peer_ms(3.5, 0.2)},
            default: {"fp32": _peer_ms(3.0, 40.0)},
            reduced: {"fp32": _peer_ms(2.5, 45.0)},
            autotuned: {"fp32": {"error": "timed out after 420 s", "timed_out_s": 420.0}},
            autotuned_alone: {"fp32": {"error": "RuntimeError: out of resource: shared memory"}},
        },
    }
    bert = {
        "model": "bert-base",
        "batch": 8,
        "backends": "tvm,cublas,cudnn",
        "collage": {
            "fp32": _gpu_run(4.4, {"cublas": 180, "tvm": 235}, tflops=36.0, fraction=0.537),
            "bf16": {"error": "ValueError: no bf16 here"},
        },
        "peers": {
            mode: {"fp32": _peer_ms(ms), "bf16": _peer_ms(ms / 3)} for mode, ms in zip(precision.GPU_MODES, (9.6, 6.0, 6.0, 4.0, 4.5))
        },
    }
    return [resnet, bert]


def test_the_torch_compile_table_has_one_row_per_model_batch_and_precision_with_every_mode_and_the_geomean():
    import precision

    text = precision.gpu_report(_torch_compile_records(), "python benchmarks/precision.py --device cuda --modes all")
    header = next(line for line in text.splitlines() if line.startswith("| model | batch | precision |"))
    assert header.startswith(
        "| model | batch | precision | eager (ms) | default (ms) | reduce-overhead (ms) | max-autotune (ms) | "
        "max-autotune-no-cudagraphs (ms) | fastest peer | Collage (ms) | Collage / fastest peer |"
    )
    rows = {
        tuple(cells[:3]): cells
        for line in text.splitlines()
        if line.startswith("| resnet50 |") or line.startswith("| bert-base |")
        for cells in [[cell.strip() for cell in line.strip("|").split("|")]]
        if len(cells) == len(header.strip("|").split("|"))
    }
    resnet = rows[("resnet50", "1", "fp32")]
    assert resnet[3:8] == ["3.500", "3.000 (40 s)", "2.500 (45 s)", "timed out (420 s)", "failed (1)"]  # eager: no compile time
    assert resnet[8:11] == ["reduce-overhead", "2.000", "0.80"]  # the fastest of the peers that ran: 2.0 / 2.5
    assert resnet[11:] == ["cudnn 139, tvm 37", "8.2", "4.10", "6.1%"]
    bert = rows[("bert-base", "8", "fp32")]
    assert bert[8:10] == ["max-autotune", "4.400"] and bert[10] == "1.10"  # 4.4 / 4.0
    assert bert[-1] == "53.7%"
    assert rows[("bert-base", "8", "bf16")][9:11] == ["failed (2)", "-"]
    geomean = math.sqrt(0.8 * 1.1)
    assert f"Geomean of Collage / fastest peer over 2 of 3 rows: {geomean:.2f} (Collage {1 / geomean:.2f}x faster)." in text
    assert "1. resnet50 b1 fp32, max-autotune-no-cudagraphs: RuntimeError: out of resource: shared memory" in text
    assert "2. bert-base b8 bf16, Collage: ValueError: no bf16 here" in text
    assert ("Peaks: H200 fp32 67 TFLOP/s (NVIDIA H200 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h200/).") in text
    assert "recorded the device as cuda:sm_90a (NVIDIA H200, compute capability 9.0, CUDA 13.0)." in text
    # The per-model tables show every mode too.
    section = text.split("## resnet50, batch 1", 1)[1]
    assert (
        "| eager (ms) | default (ms) | reduce-overhead (ms) | max-autotune (ms) | max-autotune-no-cudagraphs (ms) | Collage / best peer |"
        in section
    )


def test_no_ratio_is_claimed_while_a_peer_is_still_to_be_measured():
    import precision

    records = _torch_compile_records()
    del records[1]["peers"]["torch.compile max-autotune"]["fp32"]
    text = precision.gpu_report(records)
    row = next(line for line in text.splitlines() if line.startswith("| bert-base | 8 | fp32 |"))
    assert [cell.strip() for cell in row.strip("|").split("|")][6:11] == ["-", "4.500 (30 s)", "-", "4.400", "-"]
    assert "over 1 of 3 rows: 0.80" in text


def test_records_of_two_peers_keep_their_columns():
    """Reports made before the other torch.compile modes (PRECISION-cuda.md, TF32-cuda.md) are written as they were."""
    import precision

    record = {
        "model": "resnet50",
        "batch": 8,
        "backends": "tvm,cublas,cudnn",
        "collage": {"fp32": _gpu_run(3.46, {"cudnn": 127})},
        "peers": {
            "pytorch eager": {"fp32": {"median_s": 4.287e-3, "error": 0.0}},
            "torch.compile reduce-overhead": {"error": "RuntimeError: compile failed"},
        },
    }
    text = precision.gpu_report([record])
    assert (
        "| precision | Collage (ms) | speedup over Collage fp32 | operators | eager (ms) | reduce-overhead (ms) | "
        "Collage / best peer | Collage error | eager error | reduce-overhead error | Collage's run (s) |"
    ) in text
    row = next(line for line in text.splitlines() if line.startswith("| fp32 | 3.460"))
    assert "| 4.287 | RuntimeError: compile failed | 0.81 |" in row  # the failed peer is no contender


def test_the_gpu_benchmark_resumes_and_records_a_timeout_but_not_a_run_its_budget_cut_short(tmp_path, monkeypatch):
    import precision

    calls = []

    def run_peer(name, batch, mode, precision_, timeout_s, device="cuda"):
        calls.append((mode, precision_, timeout_s))
        if mode == "torch.compile max-autotune":
            return {"error": f"timed out after {timeout_s:.0f} s", "timed_out_s": timeout_s}
        return _peer_ms(1.0)

    made = []
    monkeypatch.setattr(precision, "run_peer", run_peer)
    monkeypatch.setattr(precision, "_onnx_file", lambda name, batch: tmp_path / "model.onnx")
    monkeypatch.setattr(
        precision, "optimize", lambda onnx, p, backends, out, extra, cost_db, timeout_s: made.append(p) or _gpu_run(0.9, {"tvm": 1})
    )
    modes = ("pytorch eager", "torch.compile max-autotune")

    class Spent(precision.Budget):  # the second peer finds 100 s left, less than its 420 s
        def __init__(self):
            self.lefts = iter([1000.0, 100.0])

        def left(self):
            return next(self.lefts, 0.0)

    record = precision.measure_on_gpu("resnet50", 1, "tvm", tmp_path, ("fp32",), modes=modes, budget=Spent())
    assert calls == [("pytorch eager", "fp32", 420.0), ("torch.compile max-autotune", "fp32", 100.0)] and not made
    assert "torch.compile max-autotune" not in record["peers"]  # cut short by the budget: measured next time
    assert precision.left_to_measure(record, ("fp32",), modes) == [
        "resnet50 b1 torch.compile max-autotune fp32",
        "resnet50 b1 Collage fp32",
    ]
    calls.clear()
    record = precision.measure_on_gpu("resnet50", 1, "tvm", tmp_path, ("fp32",), modes=modes, only="peers")
    assert calls == [("torch.compile max-autotune", "fp32", 420.0)] and not made  # the eager run is kept
    assert record["peers"]["torch.compile max-autotune"]["fp32"]["timed_out_s"] == 420.0
    calls.clear()
    record = precision.measure_on_gpu("resnet50", 1, "tvm", tmp_path, ("fp32",), modes=modes)
    assert calls == [] and made == ["fp32"]  # a time-out is a result: not measured again
    assert precision.left_to_measure(record, ("fp32",), modes) == []
    assert precision.left_to_measure(record, ("fp32",), modes, retry_failed=True) == ["resnet50 b1 torch.compile max-autotune fp32"]
    assert json.loads((tmp_path / "resnet50_b1.json").read_text()) == record
    assert not list(tmp_path.glob("*.partial"))


@pytest.mark.slow  # 25 s eager, a minute compiled, on 2 cores
@pytest.mark.parametrize("mode", ["pytorch eager", "torch.compile default"])
def test_a_gpu_peer_process_runs_on_the_cpu(mode):
    """The peers' process code, on the CPU with a 4-layer BERT: its latency, compile time and error against eager."""
    pytest.importorskip("transformers")
    import precision

    result = precision.run_peer("bert", 1, mode, "fp32", timeout_s=600, device="cpu")
    assert result["median_s"] > 0 and result["compile_s"] > 0 and result["repeats"] >= 1, result
    assert result["error"] < 1e-4


def test_more_families_get_a_section_of_their_own_with_their_geomean_and_how_many_are_within_two_percent(tmp_path):
    public, families = tmp_path / "raw", tmp_path / "raw-families"
    write_model(public, "small_b1", collage_ms=10.0, ort_ms=20.0, eager_ms=40.0, dnnl_ms=12.5)
    write_model(families, "wide_b1", collage_ms=10.0, ort_ms=10.1, eager_ms=40.0, dnnl_ms=12.5)  # 0.99 of its best peer
    write_model(families, "deep_b1", collage_ms=22.0, ort_ms=20.0, eager_ms=40.0, dnnl_ms=30.0)  # 1.10 of it
    section = peers_report.family_section(families, "python benchmarks/peers.py --set families", tmp_path / "f.png")
    report = peers_report.write_report(
        public, "cmd", tmp_path / "R.md", tmp_path / "r.png", machine_lines=[], sections=(section,)
    ).read_text()
    public_part, family_part = report.split("## More families")
    assert "| small_b1 |" in public_part and "wide_b1" not in public_part
    assert "| 1 model-batch pairs | 0.50 |" in public_part
    assert "Collage within 2% of the best peer or faster: 1 of 2 models." in family_part
    assert f"| 2 model-batch pairs | {math.sqrt(10 / 10.1 * 22 / 20):.2f} |" in family_part
    assert "| deep_b1 | 22.00 ± 0.50 | 1.10 |" in family_part and "### wide_b1" in family_part
    assert "`python benchmarks/peers.py --set families`" in family_part
    assert peers_report.family_section(tmp_path / "nothing", "cmd", tmp_path / "n.png") == []


def test_a_library_is_timed_in_a_process_started_as_its_runtime_file_tells_a_deployment(tmp_path, monkeypatch):
    import interleaved

    from collage_core.build import deploy
    from collage_core.measure import threads

    for name in threads.USER_WAIT_CHOICES:
        monkeypatch.delenv(name, raising=False)
    needs = {name: {"kind": "op-level", "version": "1", "needs": ""} for name in ("dnnl", "tvm")}
    mixed, alone = tmp_path / "mixed.so", tmp_path / "alone.so"
    for library, backends in ((mixed, needs), (alone, {"tvm": needs["tvm"]})):
        library.write_bytes(b"")
        deploy.write_runtime_file(library, backends)
    environment = interleaved.started_as_told(mixed)
    assert {name: environment[name] for name in threads.WAIT_SETTINGS} == threads.WAIT_SETTINGS
    assert environment["PATH"] == os.environ["PATH"]
    assert interleaved.started_as_told(alone) is None  # one pool: nothing to tell
    assert interleaved.started_as_told(tmp_path / "missing.so") is None


def test_the_torch_compile_chart_shows_the_rows_with_collage_and_every_peer_and_the_report_links_it(tmp_path):
    import precision

    records = _torch_compile_records()
    chart = tmp_path / "TORCH-COMPILE-cuda.png"
    text = precision.gpu_report(records, chart=chart.name)
    table_end = text.index("Geomean of Collage / fastest peer")
    assert f"]({chart.name})" in text[table_end:].split("## ", 1)[0]  # under the table of every peer
    assert "](" not in precision.gpu_report(records)  # no picture named where none was drawn
    pytest.importorskip("matplotlib")
    assert precision.draw_peers_chart(records, chart)
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [path.name for path in tmp_path.iterdir()] == [chart.name]  # written whole, nothing left beside it


def test_no_torch_compile_chart_is_drawn_before_a_row_has_collage_and_its_fastest_peer(tmp_path):
    import precision

    records = _torch_compile_records()
    for record in records:
        record["collage"] = {}
    assert not precision.draw_peers_chart(records, tmp_path / "chart.png")
    assert not list(tmp_path.iterdir())
