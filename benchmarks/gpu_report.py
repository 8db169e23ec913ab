"""The GPU section of RESULTS.md and its chart, from ``benchmarks/raw-cuda`` (written by ``peers.py --device cuda``).

Per model: Collage's placement over TVM, cuBLAS and cuDNN, each backend alone as Collage's cold run
measured it beside the placement (cuBLAS or cuDNN with TVM for the rest, TVM alone, TVM's
unpartitioned build), and PyTorch eager and torch.compile on CUDA, all in float32 with TF32 off.
Nothing in it is typed by hand.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from peers_report import cost_row, load_raw, operators_text, ratio_text, seconds_of

from collage_core.outputs.end_to_end import ONE_AFTER_ANOTHER, WITHOUT_CUDA_GRAPHS
from collage_core.search.baselines import IN_TURNS

GPU_PEERS = ("pytorch eager (cuda)", "torch.compile (cuda)", "torch.compile reduce-overhead (cuda)")
SINGLE_PREFIXES = ("tvm alone", "cublas", "cudnn", "unpartitioned relax.build")
MACHINE_FILE = "machine.json"


def _ms(seconds: Optional[float]) -> str:
    return "" if seconds is None else f"{seconds * 1e3:.3f}"


def _cost_seconds(row: Optional[dict]) -> Optional[float]:
    """The latency of a results.json end-to-end row, or None when it was not measured."""
    return None if row is None else seconds_of(cost_row(row["cost"]))


def model_rows(directory: Path) -> Optional[dict]:
    """Latencies (seconds) of every contender measured for one model, with Collage's rows as its cold run wrote them."""
    cold = load_raw(directory, "collage cold")
    peers = {peer: seconds_of(load_raw(directory, peer)) for peer in GPU_PEERS}
    if cold is None and not any(peers.values()):
        return None
    end_to_end = {row["name"]: row for row in (cold or {}).get("end_to_end", [])}
    singles = {
        name: _cost_seconds(row) for name, row in end_to_end.items() if name.startswith(SINGLE_PREFIXES) and not name.endswith(IN_TURNS)
    }
    # "placement" is the returned placement's time in turns when a contest ran (the library called one
    # call at a time), with its time one after another in a row of its own; earlier runs kept only the latter.
    placement = end_to_end.get("placement")
    returned = end_to_end.get(f"placement, {ONE_AFTER_ANOTHER}", placement)
    per_call = (
        _cost_seconds(placement)
        if (placement or {}).get("timed_in_turns")
        else next(
            (
                _cost_seconds(row)
                for name, row in end_to_end.items()
                if name.endswith(IN_TURNS) and row.get("operators_by_backend") == (returned or {}).get("operators_by_backend")
            ),
            None,
        )
    )
    return {
        "collage": _cost_seconds(returned),
        "without_graphs": _cost_seconds(end_to_end.get(WITHOUT_CUDA_GRAPHS)),
        "per_call": per_call,
        "operators": operators_text((returned or {}).get("operators_by_backend") or {}),
        "singles": singles,
        "peers": peers,
        "error": (cold or {}).get("error"),
        "wall_s": (cold or {}).get("wall_s"),
        "note": (cold or {}).get("note", ""),
        "note_detail": (cold or {}).get("note_detail", ""),
        "numerics": ((cold or {}).get("numerics") or {}).get("passed"),
        "commit": (cold or {}).get("commit", ""),
    }


def append_gpu_section(raw_root: Path, report: Path, chart: Path) -> None:
    directories = sorted(p for p in raw_root.iterdir() if p.is_dir())
    models = [(d.name, rows) for d in directories for rows in [model_rows(d)] if rows]
    if not models:
        return
    machine_file = raw_root / MACHINE_FILE
    machine = json.loads(machine_file.read_text()) if machine_file.exists() else {}
    lines = [
        "",
        "# On an NVIDIA GPU",
        "",
        f"Command: `python benchmarks/peers.py --device cuda` (raw results in `benchmarks/raw-cuda/`). "
        f"GPU: {machine.get('gpu', 'not recorded')}; driver {machine.get('driver', '?')}; PyTorch {machine.get('torch', '?')} "
        f"(cuDNN {machine.get('torch_cudnn', '?')}); Collage's backends: {machine.get('backends', 'not recorded')}.",
        "",
        "Float32 everywhere, TF32 off (PyTorch's matmul and cuDNN flags; cuDNN's tensor-core engines deselected in",
        "Collage). Collage's rows are its cold `collage optimize --target cuda --backends tvm,cublas,cudnn` run:",
        "the placement it returns, built to replay as CUDA graphs, the same placement launching kernel by kernel",
        "(\"no graphs\"), and, measured beside them, each backend alone (cuBLAS or cuDNN with TVM for the rest) and",
        "TVM's unpartitioned build, timed by TVM's evaluator (many runs between two synchronizations).",
        "\"Per call\" is the returned library timed one call at a time with a synchronization after each, as the",
        "contest in turns times it and as the PyTorch peers are timed; ratios against the peers use it where it",
        "was measured. torch.compile runs in its default mode and in \"reduce-overhead\" (its own CUDA graphs);",
        "\"best compile\" is the faster of the two. Median ms of one input; ratios are Collage's latency over the other's.",
        "",
        "| model | Collage (ms) | no graphs (ms) | per call (ms) | operators by backend | best single backend | Collage / it | "
        "eager (ms) | torch.compile (ms) | reduce-overhead (ms) | Collage / eager | Collage / best compile | numerics | "
        "search (s) | commit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in models:
        measured = {k: v for k, v in rows["singles"].items() if v is not None}
        best_name = min(measured, key=measured.get) if measured else None
        eager, compiled, reduced = (rows["peers"].get(peer) for peer in GPU_PEERS)
        best_compiled = min((v for v in (compiled, reduced) if v is not None), default=None)
        collage = rows["collage"]
        against_peers = rows["per_call"] or collage
        search = rows["note"] or ("" if rows["wall_s"] is None else f"{rows['wall_s']:.0f}")
        best = "" if best_name is None else f"{best_name} ({_ms(measured[best_name])})"
        numerics = "" if rows["numerics"] is None else ("passed" if rows["numerics"] else "FAILED")
        lines.append(
            f"| {name} | {_ms(collage) or rows['error'] or ''} | {_ms(rows['without_graphs'])} | {_ms(rows['per_call'])} | "
            f"{rows['operators']} | {best} | {ratio_text(collage, measured.get(best_name))} | {_ms(eager)} | {_ms(compiled)} | "
            f"{_ms(reduced)} | {ratio_text(against_peers, eager)} | {ratio_text(against_peers, best_compiled)} | {numerics} | "
            f"{search} | {rows['commit']} |"
        )
    notes = [f"- {name}: {rows['note_detail']}." for name, rows in models if rows["note_detail"]]
    commits = sorted({rows["commit"] for _, rows in models if rows["commit"]})
    if len(commits) > 1:
        notes.append(
            f"- Rows of different commits ({', '.join(commits)}) come from different runs, on machines of the "
            "same kind: compare the figures within a row, and across rows of one commit."
        )
    if notes:
        lines += ["", "Notes:", *notes]
    lines += [
        "",
        "Each backend alone, as Collage's cold run measured it (ms):",
        "",
        "| model | " + " | ".join(SINGLE_PREFIXES) + " |",
        "|---|" + "---|" * len(SINGLE_PREFIXES),
    ]
    for name, rows in models:
        cells = [next((_ms(v) for k, v in rows["singles"].items() if k.startswith(prefix)), "") for prefix in SINGLE_PREFIXES]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if _draw(models, chart):
        lines += ["", f"![GPU latency of every contender]({chart.name})"]
    report.write_text(report.read_text() + "\n".join(lines) + "\n")


def _draw(models, chart: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    contenders = ["collage", "collage, no graphs", *SINGLE_PREFIXES, *GPU_PEERS]
    figure, axis = plt.subplots(figsize=(max(7, 2.2 * len(models) + 2), 4))
    width = 0.8 / len(contenders)
    for index, contender in enumerate(contenders):
        values = []
        for _, rows in models:
            if contender == "collage":
                value = rows["collage"]
            elif contender == "collage, no graphs":
                value = rows["without_graphs"]
            elif contender in GPU_PEERS:
                value = rows["peers"][contender]
            else:
                value = next((v for k, v in rows["singles"].items() if k.startswith(contender)), None)
            values.append(math.nan if value is None else value * 1e3)
        axis.bar([m + index * width for m in range(len(models))], values, width, label=contender)
    axis.set_xticks([m + 0.4 - width / 2 for m in range(len(models))], [name for name, _ in models], rotation=15)
    axis.set_ylabel("median latency (ms), lower is better")
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.tight_layout()
    figure.savefig(chart, dpi=120)
    plt.close(figure)
    return True
