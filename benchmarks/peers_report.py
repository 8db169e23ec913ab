"""``benchmarks/RESULTS.md`` and ``benchmarks/results.png`` from the raw files ``peers.py`` keeps.

Every number comes from ``<raw>/<model>_b<batch>/*.json``; nothing is typed by hand. Run it
alone with ``python benchmarks/peers.py --only-report``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Optional

from collage_core.measure.timing import STOPPED_PREFIX
from collage_core.outputs.end_to_end import ONE_AFTER_ANOTHER
from collage_core.search.baselines import IN_TURNS, PREDICTED_PREFIX

OPENVINO_PEER = "openvino default session (fp32)"
PEERS = ["onnxruntime default session", OPENVINO_PEER, "pytorch eager", "torch.compile (inductor)"]
ORT_PEER = "onnxruntime default session"
COLLAGE = "collage (the placement it returns)"
COLLAGE_ROWS = {  # results.json end-to-end row -> table row (rows measured one after another)
    "placement": COLLAGE,
    # When Collage's contest ran, "placement" is its time in turns and this row its time one after
    # another, which is what the table's other rows are; it comes after "placement" and takes its place.
    f"placement, {ONE_AFTER_ANOTHER}": COLLAGE,
    "op-level placement": "collage op-level placement",
    "tvm alone": "tvm alone",
    "dnnl + tvm for the rest": "dnnl + tvm for the rest",
    "onnxruntime alone": "onnxruntime alone",
    "openvino alone": "openvino alone",
    "unpartitioned relax.build": "tvm unpartitioned relax.build",
}
TORCH_INPUT = "collage op-level, PyTorch module as input"
SINGLE_IN_TURNS = "best single backend (Collage's build of it)"
SINGLE_BACKENDS = (
    "tvm alone",
    "dnnl + tvm for the rest",
    "onnxruntime alone",
    "onnxruntime + op-level for the rest",
    "openvino alone",
    "openvino + op-level for the rest",
)
EXPLANATION_LINES = 30


def raw_file(directory: Path, config: str) -> Path:
    """Where ``peers.py`` keeps one configuration's result."""
    return directory / (config.replace(" ", "_").replace("/", "_").replace("(", "").replace(")", "") + ".json")


def single_backend_row(end_to_end_name: str) -> Optional[str]:
    """The table row of a single-backend baseline (by its results.json name), or None for another row.
    Where ONNX Runtime cannot take every operator, its row is ONNX Runtime with the op-level placement for the rest."""
    if end_to_end_name.endswith(IN_TURNS):  # the optimizer's own check in turns, not a baseline row
        return None
    for graph_level in ("onnxruntime", "openvino"):
        if end_to_end_name.startswith(f"{graph_level} +"):
            return f"{graph_level} + op-level for the rest"
    return end_to_end_name if end_to_end_name in SINGLE_BACKENDS else None


def load_raw(directory: Path, config: str) -> Optional[dict]:
    path = raw_file(directory, config)
    return json.loads(path.read_text()) if path.exists() else None


def cost_row(cost: dict) -> dict:
    if cost["kind"] != "measured":
        return {"error": cost.get("reason") or cost["kind"]}
    return {"median_s": cost["median_s"], "spread_s": cost["spread_s"], "repeats": cost["repeats"]}


def model_rows(directory: Path) -> dict[str, dict]:
    """One model's table rows: name -> {median_s, spread_s, repeats} or {error}."""
    rows: dict[str, dict] = {}
    for peer in PEERS:
        result = load_raw(directory, peer)
        if result is not None:
            rows[peer] = result
    cold = load_raw(directory, "collage cold")
    if cold is not None and "error" in cold:
        rows[COLLAGE] = cold
    for entry in (cold or {}).get("end_to_end", []):
        name = COLLAGE_ROWS.get(entry["name"]) or single_backend_row(entry["name"])
        if name:
            rows[name] = cost_row(entry["cost"])
    torch_input = load_raw(directory, "collage torch input")
    if torch_input is not None:
        placement = next((e["cost"] for e in torch_input.get("end_to_end", []) if e["name"] == "placement"), None)
        rows[TORCH_INPUT] = torch_input if placement is None else cost_row(placement)
    return rows


def interleaved_rows(directory: Path) -> dict[str, dict]:
    """The contenders timed in turns (``interleaved.py``): peer name, COLLAGE or SINGLE_IN_TURNS -> row.

    A contender's time is the median of its fastest process, as Collage's contest in turns costs a
    library (``collage_core.measure.in_turns``): a process keeps its own luck, which only ever slows it. The
    median of all its processes' runs stays in the row as ``pooled_median_s``."""
    data = load_raw(directory, "interleaved") or {}
    names = {"collage library": COLLAGE, "best single backend library": SINGLE_IN_TURNS}
    return {names.get(kind, kind): fastest_process(row) for kind, row in data.get("contenders", {}).items()}


def fastest_process(row: dict) -> dict:
    """A contender's row timed by its fastest process's median (unchanged where no process medians were kept)."""
    medians = row.get("process_medians_s")
    if not medians or row.get("median_s") is None:
        return row
    return {**row, "median_s": min(medians), "pooled_median_s": row["median_s"]}


def best_single_in_turns(directory: Path, turns: dict[str, dict], collage_s: Optional[float]) -> tuple[Optional[str], Optional[float]]:
    """The best single backend and Collage's ratio to it, both timed in turns (``turns``, the model's
    :func:`interleaved_rows`): its library was one of the contenders, or it is Collage's own placement
    (ratio 1). (None, None) if neither."""
    name = (load_raw(directory, "interleaved") or {}).get("single")
    if not name or collage_s is None:
        return None, None
    timed = seconds_of(turns.get(SINGLE_IN_TURNS))
    if timed is not None:
        return single_backend_row(name), collage_s / timed
    if SINGLE_IN_TURNS not in turns:
        return f"{single_backend_row(name)} (Collage's own placement)", 1.0
    return None, None


def seconds_of(row: Optional[dict]) -> Optional[float]:
    if row is None or "error" in row or row.get("median_s") is None:
        return None
    return row["median_s"]


def _best(rows: dict, names) -> tuple[Optional[str], Optional[float]]:
    measured = [(seconds_of(rows.get(n)), n) for n in names if seconds_of(rows.get(n)) is not None]
    if not measured:
        return None, None
    seconds, name = min(measured)
    return name, seconds


def _format_ms(row: dict) -> str:
    if "error" in row:
        if row["error"].startswith(STOPPED_PREFIX):
            return f"> {float(row['error'].rsplit(' ', 2)[-2]) * 1e3:.0f} (stopped)"
        if row["error"].startswith(PREDICTED_PREFIX):  # "not built: ... add up to 27000.000 ms, over 10x ..."
            return f"not built: its partitions add up to {row['error'].split('add up to ')[1].split(',')[0]}"
        return f"failed: {row['error'][:80]}"
    if row.get("median_s") is None:
        return "not measured"
    text = f"{row['median_s'] * 1e3:.2f} ± {row['spread_s'] * 1e3:.2f}"
    return text + (" (1 run)" if row.get("repeats") == 1 else "")


def _milliseconds(seconds: Optional[float]) -> str:
    return "" if seconds is None else f"{seconds * 1e3:.2f}"


def _div(seconds: Optional[float], reference: Optional[float]) -> Optional[float]:
    return None if seconds is None or reference is None else seconds / reference


def ratio_text(seconds: Optional[float], reference: Optional[float]) -> str:
    return "" if seconds is None or reference is None else f"{seconds / reference:.2f}"


def _geomean(values: list[float]) -> Optional[float]:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


MACHINE_LINES_FILE = "machine.txt"


def record_machine(raw_root: Path) -> None:
    """Keep this machine's lines beside the CPU rows it measures: the report names the machine that measured them."""
    (raw_root / MACHINE_LINES_FILE).write_text("\n".join(machine()) + "\n")


def recorded_machine(raw_root: Path) -> list[str]:
    """The machine lines of the last measuring run under ``raw_root``; this machine's where none was recorded."""
    recorded = raw_root / MACHINE_LINES_FILE
    return recorded.read_text().splitlines() if recorded.exists() else machine()


def machine() -> list[str]:
    import numpy

    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
        platform.processor(),
    )
    versions = {"python": platform.python_version(), "numpy": numpy.__version__}
    for module in ("tvm", "onnxruntime", "openvino", "torch", "transformers"):
        try:
            versions[module] = __import__(module).__version__
        except ImportError:
            versions[module] = "not installed"
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return [
        f"- CPU: {cpu}, {len(os.sched_getaffinity(0))} cores available; memory {memory:.0f} GiB",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        "- backends: " + _backends_line(),
    ]


def _backends_line() -> str:
    run = subprocess.run(["collage", "backends"], capture_output=True, text=True)
    rows = [line.split() for line in run.stdout.splitlines()[2:] if line.strip()]
    return ", ".join(f"{row[0]} {row[3]}" for row in rows if len(row) >= 4) or "unknown"


def explanation(directory: Path) -> Optional[str]:
    """``collage show --explain`` of the model's placement, kept as ``explanation.txt`` beside the raw files."""
    kept = directory / "explanation.txt"
    placement = directory / "collage-out" / "placement.json"
    if not kept.exists() and placement.exists():
        run = subprocess.run(["collage", "show", str(placement)], capture_output=True, text=True)
        if run.returncode == 0:
            kept.write_text(run.stdout)
    return kept.read_text() if kept.exists() else None


def _operators_by_backend(directory: Path, config: str = "collage cold") -> str:
    """The placement a ``collage optimize`` run returned, as operators per backend."""
    run = load_raw(directory, config) or {}
    placement = next((e for e in run.get("end_to_end", []) if e["name"] == "placement"), None)
    if placement is None:
        return ""
    return operators_text(placement["operators_by_backend"])


def operators_text(counts: dict) -> str:
    """Operators by backend, most first: ``cublas 240, tvm 175``."""
    return ", ".join(f"{backend} {count}" for backend, count in sorted(counts.items(), key=lambda item: -item[1]))


def _from_database(two_level: dict) -> str:
    if "from_database" in two_level:
        return f", {two_level['from_database']} of them from the cost database"
    return ""


def _search_line(directory: Path, config: str) -> Optional[str]:
    data = load_raw(directory, config)
    if data is None:
        return None
    if "error" in data:
        return f"- {config}: failed: {data['error']}"
    measurement = data.get("measurement") or {}
    two_level = data.get("two_level") or {}
    line = (
        f"- {config}: whole `collage optimize` run {data.get('wall_s', 0):.0f} s; candidates "
        f"{data.get('candidates', '?')}, measured {measurement.get('measured', '?')} "
        f"({measurement.get('from_database', '?')} from the cost database) in {measurement.get('seconds', 0):.0f} s; "
        f"search {data.get('search_s', 0):.1f} s"
    )
    if two_level:
        line += (
            f" (two-level: {two_level.get('generations')} generations, {two_level.get('measured')} placements "
            f"scored end to end{_from_database(two_level)})"
        )
    numerics = data.get("numerics") or {}
    if numerics:
        line += f"; numerics against {numerics.get('reference')}: {'pass' if numerics.get('passed') else 'FAIL'}"
    if data.get("commit"):
        line += f"; Collage at commit `{data['commit']}`"
    return line


def _commit(directory: Path, config: str) -> str:
    """The commit of the Collage code that ran ``config`` (rows measured at different commits stay
    told apart), or "" where the raw file does not say."""
    data = load_raw(directory, config) or {}
    return f"`{data['commit']}`" if data.get("commit") else ""


def model_tables(raw_root: Path, heading: str = "##") -> tuple[list[str], list[str], dict[str, list[float]], list[Path]]:
    """From every model directory under ``raw_root``: the summary table's rows, each model's details, Collage's
    ratios (against ONNX Runtime, the best peer and the best single backend) and the directories, in order."""
    directories = sorted((p for p in raw_root.iterdir() if p.is_dir() and model_rows(p)), key=_model_order)
    summary, details, ratios = [], [], {"ort": [], "peer": [], "single": []}
    for directory in directories:
        rows, turns = model_rows(directory), interleaved_rows(directory)
        head = turns if seconds_of(turns.get(COLLAGE)) is not None else rows  # timed in turns where measured
        collage = seconds_of(head.get(COLLAGE))
        peer_name, best_peer = _best(head, PEERS)
        ort = seconds_of(head.get(ORT_PEER))
        # Against the single backends: timed in turns where it was, else the optimizer's own
        # end-to-end measurements, taken minutes apart.
        single_name, best_single = _best(rows, SINGLE_BACKENDS)
        placement = seconds_of(rows.get(COLLAGE))
        turns_name, single_ratio = best_single_in_turns(directory, turns, collage)
        if single_ratio is None:
            single_ratio = None if placement is None or best_single is None else placement / best_single
        else:
            single_name = f"{turns_name}, in turns"
        for key, value in (("ort", _div(collage, ort)), ("peer", _div(collage, best_peer)), ("single", single_ratio)):
            if value is not None:
                ratios[key].append(value)
        collage_run = "collage warm" if head is turns else "collage cold"  # the run whose library is headlined
        summary.append(
            f"| {directory.name} | {_format_ms(head.get(COLLAGE, {}))} | "
            f"{ratio_text(collage, ort)} | {peer_name or ''} | {ratio_text(collage, best_peer)} | "
            f"{single_name or ''} | {'' if single_ratio is None else f'{single_ratio:.2f}'} | "
            f"{_operators_by_backend(directory, collage_run)} | {_commit(directory, collage_run)} |"
        )
        details += [f"{heading} {directory.name}", ""]
        if turns:
            processes = (load_raw(directory, "interleaved") or {}).get("processes", 1)
            details += [
                f"Timed in turns (`interleaved.py`, {processes} process{'es' if processes > 1 else ''} per "
                "contender); Collage's library is the one the warm `collage optimize` "
                f"run wrote ({_operators_by_backend(directory, 'collage warm')}):",
                "",
                "| contender | fastest process's median ± IQR of all runs (ms) | runs | vs Collage | "
                "median of each process (ms) | median of all runs (ms) |",
                "|---|---|---|---|---|---|",
            ]
            details += [
                f"| {name} | {_format_ms(row)} | {row.get('repeats', '')} | {ratio_text(seconds_of(row), collage)} | "
                f"{', '.join(_milliseconds(s) for s in row.get('process_medians_s', []))} | "
                f"{_milliseconds(row.get('pooled_median_s'))} |"
                for name, row in turns.items()
            ]
            details += ["", "Each configuration in its own process, one after another:", ""]
        best_sequential_peer = _best(rows, PEERS)[1]
        details += ["| configuration | median ± IQR (ms) | vs best peer | vs best single backend |", "|---|---|---|---|"]
        details += [
            f"| {name} | {_format_ms(row)} | {ratio_text(seconds_of(row), best_sequential_peer)} | "
            f"{ratio_text(seconds_of(row), best_single)} |"
            for name, row in rows.items()
        ]
        details.append("")
        details += [
            line for config in ("collage cold", "collage warm", "collage torch input") for line in [_search_line(directory, config)] if line
        ]
        text = explanation(directory)
        if text:
            shown = text.strip().splitlines()[:EXPLANATION_LINES]
            details += [
                "",
                "<details><summary>the placement, explained (<code>collage show placement.json</code>, "
                f"first {len(shown)} lines of <a href=\"{raw_root.name}/{directory.name}/explanation.txt\">explanation.txt</a>)"
                "</summary>",
                "",
                "```",
                *shown,
                "```",
                "</details>",
            ]
        details.append("")
    return summary, details, ratios, directories


def geomean_table(ratios: dict[str, list[float]]) -> list[str]:
    geomeans = {key: _geomean(values) for key, values in ratios.items()}
    return [
        "| geomean over models | Collage / ONNX Runtime | Collage / best peer | Collage / best single backend |",
        "|---|---|---|---|",
        "| {} model-batch pairs | {} | {} | {} |".format(
            len(ratios["ort"]), *(f"{geomeans[k]:.2f}" if geomeans[k] else "" for k in ("ort", "peer", "single"))
        ),
        "",
    ]


SUMMARY_HEAD = [
    "| model | Collage (ms) | vs ONNX Runtime | best peer | vs best peer | best single backend | vs it | "
    "operators by backend in Collage's timed library | Collage's commit |",
    "|---|---|---|---|---|---|---|---|---|",
]


def _chart_of(directories: list[Path], chart: Path) -> None:
    draw_chart([(d.name, model_rows(d), {k: v for k, v in interleaved_rows(d).items() if seconds_of(v)}) for d in directories], chart)


def family_section(raw_root: Path, command: str, chart: Path) -> list[str]:
    """RESULTS.md's section for models of more families (``peers.py --set families``): its own geomean, table,
    chart and details, from the raw files under ``raw_root``; no lines when nothing was measured there."""
    if not raw_root.is_dir():
        return []
    summary, details, ratios, directories = model_tables(raw_root, heading="###")
    if not directories:
        return []
    _chart_of(directories, chart)
    within = sum(1 for ratio in ratios["peer"] if ratio <= 1.02)
    return [
        "## More families, at their published full-size configurations (CPU, batch 1)",
        "",
        f"Command: `{command}` (resumable; raw results in `benchmarks/{raw_root.name}/`). Models of families beyond "
        "the six above, built by `scripts/make_hf_models.py` from each family's published configuration (its "
        "`FAMILIES`; seeded random weights), timed as above: Collage's library and the peers in turns, in one run "
        "per model.",
        "",
        *recorded_machine(raw_root),
        "",
        f"Collage within 2% of the best peer or faster: {within} of {len(ratios['peer'])} models.",
        "",
        *geomean_table(ratios),
        *SUMMARY_HEAD,
        *summary,
        "",
        f"![latency of every configuration and speed relative to ONNX Runtime]({chart.name})",
        "",
        *details,
    ]


def write_report(
    raw_root: Path, command: str, report: Path, chart: Path, machine_lines: Optional[list[str]] = None, sections: tuple[list[str], ...] = ()
) -> Path:
    """Write the report and the chart from every model directory under ``raw_root``, then ``sections`` (lines each,
    as ``family_section`` gives); returns the report's path."""
    summary, details, ratios, directories = model_tables(raw_root)
    lines = [
        "# Collage against its peers",
        "",
        f"Command: `{command}` (resumable; raw results in `benchmarks/raw/`).",
        "",
        *(recorded_machine(raw_root) if machine_lines is None else machine_lines),
        "",
        "Median latency ± interquartile range for one input. Ratios are Collage's latency over the other's:",
        "below 1 Collage is faster. Collage's library (as the warm `collage optimize` run wrote it) and the",
        "peers are timed in turns (`benchmarks/interleaved.py`), because this machine's speed drifts by a",
        "third between minutes; where the details say so, each contender ran in two processes, and its time",
        "is its fastest process's median, as each process keeps its own luck and that luck only slows (GPT-2",
        "b8 in OpenVINO's default session: one process 1.30 s a run in turns, the other 0.94 s, and 0.91 s",
        "alone; Collage's contest costs a library the same way). The details give each process's median and",
        "the median of all runs.",
        "The best single backend's build is timed in turns",
        "with them too (\"in turns\"), or is Collage's own placement (ratio 1); where neither, the placement",
        "the cold run returned is compared with the baselines that run measured beside it. \"Best single",
        "backend\" is the fastest of TVM alone, DNNL with TVM for the rest, and ONNX Runtime and OpenVINO (each",
        "with the op-level placement for what it cannot run), each built by Collage and measured by `collage optimize` beside",
        "its placement.",
        "A baseline whose one run takes longer than `--baseline-limit` (60 s) was stopped; a run over 5 s is",
        "timed once.",
        "",
        *geomean_table(ratios),
        *SUMMARY_HEAD,
        *summary,
        "",
        f"![latency of every configuration and speed relative to ONNX Runtime]({chart.name})",
        "",
        *details,
        *(line for section in sections for line in section),
    ]
    report.write_text("\n".join(lines) + "\n")
    _chart_of(directories, chart)
    return report


def _model_order(directory: Path) -> tuple:
    """Batch, then model: every model at batch 1 first (``vit_base_b1``: batch 1, not "ase_b1")."""
    batch = re.search(r"_b(\d+)(?:_|$)", directory.name)
    return (int(batch.group(1)) if batch else 0, directory.name)


def relative_speeds(turns_by_model: list[dict]) -> dict[str, list[Optional[float]]]:
    """Per contender timed in turns, its speed relative to ONNX Runtime timed in the same turns, one
    value per model (None where either was not timed)."""
    speeds = {}
    for config in (COLLAGE, *PEERS, SINGLE_IN_TURNS):
        values = [_div(seconds_of(turns.get(ORT_PEER)), seconds_of(turns.get(config))) for turns in turns_by_model]
        if any(values):
            speeds[config] = values
    return speeds


def draw_chart(models: list[tuple[str, dict, dict]], path: Path) -> None:
    """Two panels from (model, rows measured one after another, rows timed in turns): the latency of
    every configuration (log; hatched where measured one after another), and the speed relative to
    ONNX Runtime of the contenders timed in turns only, as ratios across minutes would mislead."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no chart: matplotlib is not installed (pip install -e '.[bench]')")
        return
    speeds = relative_speeds([turns for _, _, turns in models])
    merged = [(name, {**rows, **turns}) for name, rows, turns in models]
    configs = [
        c
        for c in [COLLAGE, *PEERS, SINGLE_IN_TURNS, *SINGLE_BACKENDS, TORCH_INPUT, "tvm unpartitioned relax.build"]
        if any(seconds_of(rows.get(c)) for _, rows in merged)
    ]
    figure, (latency, relative) = plt.subplots(2, 1, figsize=(max(8, 1.3 * len(models)) + 4, 9))
    width = 0.8 / max(1, len(configs))
    positions = range(len(models))
    for index, config in enumerate(configs):
        x = [m + index * width for m in positions]
        timed = [seconds_of(turns.get(config)) for _, _, turns in models]
        sequential = [None if t else seconds_of(rows.get(config)) for t, (_, rows, _) in zip(timed, models)]
        latency.bar(x, [s * 1e3 if s else 0 for s in timed], width, label=config if any(timed) else None, color=f"C{index}")
        if any(sequential):
            latency.bar(
                x,
                [s * 1e3 if s else 0 for s in sequential],
                width,
                color=f"C{index}",
                hatch="///",
                edgecolor="white",
                label=None if any(timed) else f"{config} (one after another)",
            )
    relative_width = 0.8 / max(1, len(speeds))
    for index, config in enumerate(speeds):
        x = [m + index * relative_width for m in positions]
        relative.bar(x, [speed or 0 for speed in speeds[config]], relative_width, label=config, color=f"C{configs.index(config)}")
    for axis, bar_width in ((latency, width), (relative, relative_width)):
        axis.set_xticks([m + 0.4 - bar_width / 2 for m in positions], [name for name, _, _ in models], rotation=20, fontsize=8)
    latency.set_yscale("log")
    latency.set_ylabel("median latency, ms (log)")
    latency.set_title("solid: timed in turns; hatched: measured one after another", fontsize=9)
    latency.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    relative.set_yscale("log")
    relative.axhline(1.0, color="black", linewidth=0.8)
    relative.set_ylabel("speed relative to ONNX Runtime (log; above 1: faster)")
    relative.set_title("timed in turns (no bar for the best single backend: it is Collage's own placement)", fontsize=9)
    relative.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    figure.savefig(path, dpi=110)
