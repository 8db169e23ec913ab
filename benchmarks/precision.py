"""Collage at fp32 and at bf16 (and fp16 on a GPU) beside the peers at the same precisions, in one run.

    python benchmarks/precision.py [--models bert-base,resnet50] [--batches 1] [--backends tvm,dnnl,onnxruntime,openvino]
                                   [--raw benchmarks/raw-precision] [--only-report]
    python benchmarks/precision.py --device cuda [--models ...] [--batches 1,8] [--backends tvm,cublas,cudnn]
                                   [--precisions fp32,bf16,fp16,bf16@1e-3,fp16+cutlass] [--modes all]
                                   [--only peers|collage] [--budget-s S] [--raw DIR --report FILE]

For each model and batch: ``collage optimize --precision fp32`` and ``--precision bf16`` with the same
backends and Collage's default search (fresh cost database each), then Collage's two libraries, ONNX Runtime's
default session (fp32), PyTorch eager at fp32 and with CPU bf16 autocast, and OpenVINO with its inference
precision hint at f32 and at bf16, timed in turns (``benchmarks/interleaved.py``). Every contender's error
is measured on the same input against PyTorch at fp32: max |out - ref| over max |ref|. Resumable: each
model's results are kept in ``--raw`` as they are measured. Writes ``benchmarks/PRECISION.md``.
Needs a CPU with AMX or AVX512-BF16 (Collage refuses bf16 elsewhere).

With ``--device cuda``: Collage with ``--target cuda`` at fp32, bf16 and fp16 (its own end-to-end
measurement, replaying CUDA graphs, its verification's error against ONNX Runtime, and the FLOPs per run, rate
and fraction of the GPU's peak its report gives), and the PyTorch peers of ``--modes`` (eager and
``torch.compile`` "reduce-overhead" by default; ``all`` adds torch.compile's "default", "max-autotune" and
"max-autotune-no-cudagraphs") at fp32 (TF32 off) and under CUDA autocast at bf16 and fp16 (and at tf32, float32
with PyTorch's TF32 flags on): each peer at each precision in a process of its own with an empty compile cache,
its first call's time (compiling and autotuning) kept beside its latency, timed after a warm-up, with its error
against eager fp32 on the same input; a process still running after ``--peer-timeout-s`` (420 s) is stopped
and recorded as timed out. ``P@E`` among ``--precisions`` adds a Collage run at precision P
held to ``--accuracy-budget E``, compared with the peers at P; ``P+B`` adds a run at P with backend B
besides ``--backends`` (``fp16+cutlass``: what CUTLASS adds, in the same run and cost database). The GPU is not
shared, so nothing there needs timing in turns. Raw results in ``<raw>-cuda/<model>.json``, written whole as each
peer and each Collage run is measured, never measured again (``--retry-failed`` measures again what failed or
timed out): a call resumes where the one before stopped. ``--only peers`` or ``--only collage`` measures one kind;
``--budget-s S`` starts nothing past S seconds and stops what still runs then, without recording it, for a machine
lent for a few minutes at a time. The report (``--report``, default ``benchmarks/PRECISION-cuda.md``) opens with
one table of every model, batch and precision: each peer (its compile time in parentheses), Collage, Collage over
the fastest peer, the geomean of that ratio, and the fraction of peak; ``<raw>/about.md`` (the machine, the leases,
what ran where) goes under its title when that file exists.

Issue 48's table, every torch.compile mode against Collage at fp32 and bf16 (``benchmarks/TORCH-COMPILE-cuda.md``,
which ``benchmarks/peers.py`` puts in RESULTS.md), is made by calls of

    python benchmarks/precision.py --device cuda --models resnet50,bert-base,gpt2 --batches 1,8 --precisions fp32,bf16 \\
        --modes all --raw benchmarks/raw-torch-compile-cuda --report benchmarks/TORCH-COMPILE-cuda.md --budget-s 500

each resuming the one before, until it prints that nothing is left to measure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "scripts"))
import interleaved  # noqa: E402
from peers import _onnx_file, _stem  # noqa: E402
from peers_report import operators_text  # noqa: E402

PRECISIONS = ("fp32", "bf16")
PEERS = ["onnxruntime default session", "pytorch eager", interleaved.TORCH_BF16, *interleaved.OPENVINO_PRECISIONS]
PEER_PRECISION = {
    "onnxruntime default session": "fp32",
    "pytorch eager": "fp32",
    interleaved.TORCH_BF16: "bf16",
    "openvino default session (fp32)": "fp32",
    "openvino default session (bf16)": "bf16",
}


GPU_PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
DEFAULT_GPU_PRECISIONS = ("fp32", "bf16", "fp16")
# The PyTorch peers on the GPU, each at each precision in a process of its own: eager, and torch.compile (inductor)
# in each of its modes ("default"; "reduce-overhead": CUDA graphs; "max-autotune": Triton GEMM and convolution
# autotuning with CUDA graphs; "max-autotune-no-cudagraphs": the autotuning alone).
GPU_MODES = (
    "pytorch eager",
    "torch.compile default",
    "torch.compile reduce-overhead",
    "torch.compile max-autotune",
    "torch.compile max-autotune-no-cudagraphs",
)
DEFAULT_GPU_MODES = ("pytorch eager", "torch.compile reduce-overhead")
# A peer's process is stopped after this long and recorded as timed out: max-autotune compiles and autotunes for minutes.
PEER_TIMEOUT_S = 420.0
GPU_PEER_CODE = r"""
import json, sys, time
import numpy as np
import torch
sys.path.insert(0, sys.argv[4])
import make_hf_models as models
name, batch, mode, precision, device = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[5], sys.argv[6]
torch.backends.cuda.matmul.allow_tf32 = False  # fp32 is float32 as Collage computes it
torch.backends.cudnn.allow_tf32 = False
model, example, _ = models.module_and_input(name, batch)
model, example = model.to(device), example.to(device)
first = lambda out: (out if isinstance(out, torch.Tensor) else out[0]).float()
with torch.inference_mode():
    reference = first(model(example))
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"  # TF32 tensor cores
dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
run_model = torch.compile(model, mode=mode.removeprefix("torch.compile ")) if mode.startswith("torch.compile") else model
def function():
    with torch.inference_mode(), torch.autocast(device, dtype=dtype or torch.float32, enabled=dtype is not None):
        out = run_model(example)
    if device == "cuda":
        torch.cuda.synchronize()
    return out
started = time.perf_counter()
out = function()  # torch.compile traces, compiles and autotunes here
compile_s = time.perf_counter() - started
started = time.perf_counter()
for _ in range(2):  # "reduce-overhead" records its CUDA graphs in these
    out = function()
warmup_s = time.perf_counter() - started
error = float((first(out) - reference).abs().max() / reference.abs().max())
samples = []
while len(samples) < 50 and sum(samples) < 10.0:
    begin = time.perf_counter()
    function()
    samples.append(time.perf_counter() - begin)
q1, median, q3 = np.percentile(samples, [25, 50, 75])
print(json.dumps({"median_s": float(median), "spread_s": float(q3 - q1), "repeats": len(samples), "compile_s": compile_s,
                  "setup_s": compile_s + warmup_s, "error": error, "torch": torch.__version__}))
"""


class Budget:
    """The seconds one call of the benchmark may still spend (``--budget-s``; None: no bound)."""

    def __init__(self, seconds: float | None):
        self.deadline = None if seconds is None else time.monotonic() + seconds

    def left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()


def _stop_group(process: subprocess.Popen) -> None:
    """Stop a process started in a session of its own, with every process it started (inductor's compile workers,
    Collage's workers): SIGTERM, then SIGKILL what is left 10 s later."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def run_peer(name: str, batch: int, mode: str, precision: str, timeout_s: float, device: str = "cuda") -> dict | None:
    """One peer at one precision in a process of its own with an empty compile cache (its compile time is a cold
    one): its latency and compile time, ``{"error": ...}`` if it failed, ``{"error": ..., "timed_out_s": T}`` if
    it ran past ``timeout_s``."""
    with tempfile.TemporaryDirectory(prefix="collage-peer-") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": str(Path(cache) / "triton")}
        process = subprocess.Popen(
            [sys.executable, "-c", GPU_PEER_CODE, name, str(batch), mode, str(ROOT / "scripts"), precision, device],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop_group(process)
            process.communicate()
            return {"error": f"timed out after {timeout_s:.0f} s", "timed_out_s": timeout_s}
    if process.returncode != 0:
        lines = [line for line in stderr.strip().splitlines() if line.strip()]
        return {"error": lines[-1] if lines else f"exit code {process.returncode}"}
    return json.loads(stdout.strip().splitlines()[-1])


def collage_name(precision: str) -> str:
    return f"{interleaved.COLLAGE} ({precision})"


def optimize(
    onnx: Path, precision: str, backends: str, out: Path, extra: tuple = (), cost_db: Path | None = None, timeout_s: float | None = None
) -> dict | None:
    """Collage's run and its results.json; ``{"error": ...}`` when it failed; None when it was stopped after
    ``timeout_s`` (the benchmark's budget ran out: nothing to record)."""
    started = time.perf_counter()
    # The search is Collage's default: two-level where a graph-level backend is among ``backends``, else op-level.
    command = [
        sys.executable,
        "-m",
        "collage_core",
        "optimize",
        str(onnx),
        "--precision",
        precision,
        "--backends",
        backends,
        "--output",
        str(out),
        "--cost-db",
        str(cost_db or out / "costs.sqlite"),
        *extra,
    ]
    last = "failed"
    with subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True) as process:
        stopped = threading.Event()

        def stop():
            stopped.set()
            _stop_group(process)

        stopper = threading.Timer(timeout_s if timeout_s is not None else 1e9, stop)
        stopper.start()
        for line in process.stderr:  # its progress shows as it goes; the last line names a failure
            sys.stderr.write(line)
            last = line.strip() or last
        process.wait()
        stopper.cancel()
    if stopped.is_set():
        return None
    if process.returncode not in (0, 3):  # 3: numerics failed, which the table shows
        return {"error": last}
    results = json.loads((out / "results.json").read_text())
    return {"results": results, "wall_s": time.perf_counter() - started}


def relative_errors(name: str, batch: int, libraries: dict) -> dict:
    """Each contender's max |out - ref| / max |ref| on the benchmark's input, against PyTorch at fp32."""
    import make_hf_models as models
    import torch

    model, example, input_name = models.module_and_input(name, batch)
    with torch.inference_mode():
        reference = model(example)
        reference = (reference if isinstance(reference, torch.Tensor) else reference[0]).float().numpy()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = model(example)
        autocast = (autocast if isinstance(autocast, torch.Tensor) else autocast[0]).float().numpy()

    def error(output) -> float:
        return float(np.abs(np.asarray(output, np.float64) - reference).max() / np.abs(reference).max())

    errors = {"pytorch eager": 0.0, interleaved.TORCH_BF16: error(autocast)}
    import onnxruntime
    import openvino

    onnx = _onnx_file(name, batch)
    session = onnxruntime.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    errors["onnxruntime default session"] = error(session.run(None, {input_name: example.numpy()})[0])
    for peer, hint in interleaved.OPENVINO_PRECISIONS.items():
        compiled = openvino.Core().compile_model(str(onnx), "CPU", {"INFERENCE_PRECISION_HINT": hint})
        errors[peer] = error(compiled.create_infer_request().infer({input_name: example.numpy()})[0])
    from collage_core import tvm_compat
    from collage_core.build.deploy import load_vm

    for contender, library in libraries.items():
        result = load_vm(library)["main"](tvm_compat.to_tensor(example.numpy(), tvm_compat.device_for(tvm_compat.host_cpu_target())))
        errors[contender] = error(tvm_compat.to_numpy(result if hasattr(result, "numpy") else result[0]))
    return errors


def measure(name: str, batch: int, backends: str, raw: Path, again: tuple = ()) -> dict:
    """Collage at each precision, then every contender in turns. ``again``: precisions whose Collage run is made
    anew while the others' libraries (still where the record says) are timed again beside it."""
    path = raw / f"{_stem(name, batch)}.json"
    if path.exists() and not again:
        return json.loads(path.read_text())
    onnx = _onnx_file(name, batch)
    work = Path(tempfile.mkdtemp(prefix=f"precision-{name}-"))
    record = json.loads(path.read_text()) if again else {"model": name, "batch": batch, "backends": backends, "collage": {}}
    libraries = {}
    for precision in PRECISIONS:
        kept = record["collage"].get(precision, {})
        if precision not in again and Path(kept.get("library", "")).is_file():
            libraries[collage_name(precision)] = Path(kept["library"])
            continue
        print(f"{name} b{batch}: collage optimize --precision {precision}", flush=True)
        run = optimize(onnx, precision, backends, work / precision)
        record["collage"][precision] = run
        library = work / precision / f"{onnx.stem}.so"
        if "error" not in run and library.exists():
            libraries[collage_name(precision)] = library
            run["library"] = str(library)
    print(f"{name} b{batch}: timing {len(libraries)} libraries and {len(PEERS)} peers in turns", flush=True)
    contenders = [(peer, onnx) for peer in PEERS] + list(libraries.items())
    record["in_turns"] = interleaved.measure(name, batch, onnx, contenders=contenders)
    record["errors"] = relative_errors(name, batch, libraries)
    raw.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    return record


def parse_run(spec: str, backends: str) -> tuple[str, str, str]:
    """A ``--precisions`` entry (``P``, ``P@E``, ``P/nhwc``, ``P+B[+B...]``) as (precision, accuracy budget or "",
    backends); ``run_layout`` reads its layout."""
    base, *added = spec.split("+")
    precision, _, budget = base.partition("/")[0].partition("@")
    if precision not in GPU_PRECISIONS:
        raise ValueError(f"{spec!r}: the precision is one of {', '.join(GPU_PRECISIONS)}")
    return precision, budget, ",".join([*backends.split(","), *(b for b in added if b not in backends.split(","))])


def run_layout(spec: str) -> str:
    """The layout a ``--precisions`` entry asks for (``bf16/nhwc``: ``collage optimize --layout nhwc``,
    ``bf16/model``: the model's own); "" for Collage's default (auto)."""
    layout = spec.split("+")[0].partition("/")[2]
    if layout not in ("", "nhwc", "model"):
        raise ValueError(f"{spec!r}: the layout after / is nhwc or model")
    return layout


def run_label(spec: str) -> str:
    """How a run's row is named: ``fp16``, ``bf16, budget 2e-3``, ``bf16, NHWC``, ``fp16 + cutlass``."""
    base, *added = spec.split("+")
    base, _, layout = base.partition("/")
    precision, _, budget = base.partition("@")
    label = f"{precision}, budget {budget}" if budget else precision
    return label + {"": "", "nhwc": ", NHWC", "model": ", model layout"}[layout] + "".join(f" + {b}" for b in added)


ABOUT_FILE = "about.md"  # beside a GPU run's raw records: what the report says under its title


def _to_measure(entry: dict | None, retry_failed: bool) -> bool:
    """Whether a peer's or a Collage run's entry is still to be measured: never measured, or failed (an error
    message and no latency; a measured peer's ``error`` is its numeric error) and ``retry_failed``."""
    return entry is None or (retry_failed and isinstance(entry.get("error"), str) and "median_s" not in entry)


def measure_on_gpu(
    name: str,
    batch: int,
    backends: str,
    raw: Path,
    precisions=DEFAULT_GPU_PRECISIONS,
    compare: bool = False,
    modes=DEFAULT_GPU_MODES,
    only: str = "",
    budget: Budget | None = None,
    peer_timeout_s: float = PEER_TIMEOUT_S,
    retry_failed: bool = False,
    cost_dbs: Path | None = None,
    collage_args: tuple = (),
) -> dict:
    """Collage at each precision on the GPU and the PyTorch peers (``modes``) at each precision, each measured once
    and kept as it is measured: a call resumes where the one before stopped. ``only``: "peers" or "collage".

    Each peer runs at each precision in a process of its own, stopped after ``peer_timeout_s`` and recorded as timed
    out; one cut short by ``budget`` is not recorded, nor is a Collage run. A recorded failure or time-out stays
    unless ``retry_failed``. Collage's runs of one model and batch share a cost database (its keys hold the precision,
    so nothing is mixed up): an accuracy budget's probes reuse what the plain runs measured. Single-backend baselines
    are left out unless ``compare``: the comparison here is with the peers. The cost databases lie in ``cost_dbs``
    (default: a folder under the temporary directory), so a run cut short by ``budget`` resumes with what it measured
    when the folder travels to the next machine. ``collage_args`` go to every ``collage optimize`` (``--budget 240``)."""
    budget = budget or Budget(None)
    path = raw / f"{_stem(name, batch)}.json"
    record = (
        json.loads(path.read_text()) if path.exists() else {"model": name, "batch": batch, "backends": backends, "collage": {}, "peers": {}}
    )
    raw.mkdir(parents=True, exist_ok=True)

    def keep():
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(record, indent=1, default=str) + "\n")
        partial.replace(path)

    def wanted(entry) -> bool:
        return _to_measure(entry, retry_failed)

    asked = sorted({parse_run(spec, backends)[0] for spec in precisions}, key=GPU_PRECISIONS.index)
    for mode in modes if only != "collage" else ():
        for precision in asked:
            measured = record["peers"].get(mode, {})
            if not wanted(measured.get(precision)):
                continue
            left = budget.left()
            if left < 30:
                print(f"{name} b{batch}: {mode} at {precision} not started: the budget is spent", flush=True)
                return record
            timeout_s = min(peer_timeout_s, left)
            print(f"{name} b{batch}: {mode} at {precision} (stopped after {timeout_s:.0f} s)", flush=True)
            result = run_peer(name, batch, mode, precision, timeout_s)
            if "timed_out_s" in result and timeout_s < peer_timeout_s:
                print(f"{name} b{batch}: {mode} at {precision} cut short by the budget: measured in a later call", flush=True)
                return record
            print(f"{name} b{batch}: {mode} at {precision}: {json.dumps(result)}", flush=True)
            # The precisions measured before stay; an entry of records older than one process per precision goes.
            record["peers"][mode] = {**{p: r for p, r in measured.items() if p != "error"}, precision: result}
            keep()
    cost_db = (cost_dbs or Path(tempfile.gettempdir()) / "collage-precision") / f"{_stem(name, batch)}.sqlite"
    cost_db.parent.mkdir(parents=True, exist_ok=True)
    for spec in precisions if only != "peers" else ():  # "bf16", with an accuracy budget "bf16@1e-3", with another backend "fp16+cutlass"
        if wanted(record["collage"].get(spec)):
            onnx = _onnx_file(name, batch) if budget.left() >= 60 else None  # made by scripts/make_hf_models.py once
            left = budget.left()
            if left < 60:
                print(f"{name} b{batch}: Collage at {spec} not started: the budget is spent", flush=True)
                return record
            precision, accuracy_budget, run_backends = parse_run(spec, backends)
            extra = (
                "--target",
                "cuda",
                *(("--accuracy-budget", accuracy_budget) if accuracy_budget else ()),
                *(("--layout", run_layout(spec)) if run_layout(spec) else ()),
                *(() if compare else ("--no-compare",)),
                *collage_args,
            )
            print(f"{name} b{batch}: collage optimize {' '.join(extra)} --precision {precision} --backends {run_backends}", flush=True)
            out = Path(tempfile.mkdtemp(prefix=f"precision-{name}-")) / re.sub(r"[@+/]", "-", spec)
            run = optimize(onnx, precision, run_backends, out, extra, cost_db, None if left == float("inf") else left)
            if run is None:
                print(f"{name} b{batch}: Collage at {spec} cut short by the budget: made again in a later call", flush=True)
                return record
            record["collage"][spec] = run
            keep()
    return record


def left_to_measure(record: dict, precisions, modes, only: str = "", retry_failed: bool = False) -> list[str]:
    """What a call of ``measure_on_gpu`` with these settings would still measure for ``record``."""

    def wanted(entry) -> bool:
        return _to_measure(entry, retry_failed)

    asked = sorted({parse_run(spec, record["backends"])[0] for spec in precisions}, key=GPU_PRECISIONS.index)
    where = f"{record['model']} b{record['batch']}"
    peers = [f"{where} {mode} {p}" for mode in modes if only != "collage" for p in asked if wanted(record["peers"].get(mode, {}).get(p))]
    return peers + [f"{where} Collage {spec}" for spec in precisions if only != "peers" and wanted(record["collage"].get(spec))]


def _placed(run: dict) -> dict:
    """The end-to-end entry of the placement a Collage run returned ({} if it has none)."""
    return (run.get("results", {}).get("end_to_end") or [{}])[0]


def _short(mode: str) -> str:
    """A peer's column: ``eager``, ``default``, ``max-autotune``."""
    return mode.removeprefix("torch.compile ").removeprefix("pytorch ")


def _shown_modes(records: list[dict]) -> list[str]:
    """The peers measured in any of ``records``, in :data:`GPU_MODES`' order."""
    return [mode for mode in GPU_MODES if any(mode in record["peers"] for record in records)]


def _peer(record: dict, mode: str, precision: str) -> dict | None:
    """A peer's entry at a precision: measured (``median_s``), failed or timed out (``error`` text), or None when
    not measured yet. Records older than one process per precision kept one failure for all precisions."""
    entries = record["peers"].get(mode, {})
    entry = entries.get(precision)
    if entry is None and isinstance(entries.get("error"), str):
        return {"error": entries["error"]}
    return entry


def _fastest(record: dict, precision: str, modes: list[str]) -> tuple[str, float] | None:
    """The fastest peer at ``precision`` and its latency, once every peer of ``modes`` has an entry there (a peer
    that failed or timed out is not a contender); None before."""
    entries = {mode: _peer(record, mode, precision) for mode in modes}
    if not modes or any(entry is None for entry in entries.values()):
        return None
    measured = {mode: entry["median_s"] for mode, entry in entries.items() if "median_s" in entry}
    if not measured:
        return None
    mode = min(measured, key=measured.get)
    return mode, measured[mode]


def draw_peers_chart(records: list[dict], path: Path) -> bool:
    """The torch.compile table as a picture: for each model, batch and precision with Collage's run and its fastest
    peer measured, every peer's latency and Collage's over the fastest peer's (log scale; lower is faster), Collage's
    ratio written on its bar. False (nothing written) without matplotlib or without such a row."""
    modes = _shown_modes(records)
    rows = []
    for record in records:
        for precision in GPU_PRECISIONS:
            collage_s = _placed(record["collage"].get(precision, {})).get("cost", {}).get("median_s")
            fastest = _fastest(record, precision, modes)
            if collage_s and fastest:
                peers = {mode: (_peer(record, mode, precision) or {}).get("median_s") for mode in modes}
                rows.append((f"{record['model']}\nb{record['batch']} {precision}", peers, collage_s, fastest[1]))
    if not rows:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    bars = [*modes, "Collage"]
    width = 0.8 / len(bars)
    figure, axis = plt.subplots(figsize=(max(7, 1.6 * len(rows) + 2.5), 4.2))
    lowest = math.inf
    for index, bar in enumerate(bars):
        values = [(collage_s if bar == "Collage" else peers[bar] or math.nan) / fastest_s for _, peers, collage_s, fastest_s in rows]
        lowest = min([lowest, *[value for value in values if not math.isnan(value)]])
        where = [row + index * width for row in range(len(rows))]
        axis.bar(where, values, width, label=_short(bar), color="black" if bar == "Collage" else None)
        if bar == "Collage":
            for x, value in zip(where, values):
                axis.annotate(f"{value:.2f}", (x, value), ha="center", va="bottom", xytext=(0, 2), textcoords="offset points", fontsize=8)
    axis.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    axis.set_yscale("log")
    axis.set_ylim(bottom=lowest / 1.5)
    axis.set_xticks([row + 0.4 - width / 2 for row in range(len(rows))], [label for label, *_ in rows], fontsize=8)
    axis.set_ylabel("latency / fastest peer's (log), lower is faster")
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial.png")
    figure.savefig(partial, dpi=120)
    plt.close(figure)
    os.replace(partial, path)
    return True


def _peer_cell(entry: dict | None, mode: str, notes: list[str], where: str) -> str:
    """``1.234 (41 s)``: the latency in ms and, for torch.compile, the first call's seconds (compiling and
    autotuning); a time-out as such; a failure as a numbered note under the table."""
    if entry is None:
        return "-"
    if "median_s" in entry:
        compiled = entry.get("compile_s") if mode.startswith("torch.compile") else None
        return f"{entry['median_s'] * 1e3:.3f}" + (f" ({compiled:.0f} s)" if compiled is not None else "")
    if "timed_out_s" in entry:
        return f"timed out ({entry['timed_out_s']:.0f} s)"
    notes.append(f"{where}, {_short(mode)}: {entry.get('error', 'failed')}")
    return f"failed ({len(notes)})"


def peers_table(records: list[dict]) -> list[str]:
    """One row per model, batch and precision: every peer measured (latency, compile time), Collage, Collage over
    the fastest peer, the placement's backends, and the FLOPs, rate and fraction of the GPU's peak Collage's run
    recorded (``throughput`` in its results.json); then the geomean of the ratios, and the peaks and their sources."""
    modes = _shown_modes(records)
    lines = [
        "| model | batch | precision | "
        + " | ".join(f"{_short(mode)} (ms)" for mode in modes)
        + " | fastest peer | Collage (ms) | Collage / fastest peer | Collage's backends | GFLOP | TFLOP/s | of peak |",
        "|---|---|---|" + "---|" * len(modes) + "---|---|---|---|---|---|---|",
    ]
    notes: list[str] = []
    ratios, rows, peaks, devices = [], 0, {}, set()
    for record in records:
        for precision in GPU_PRECISIONS:
            run = record["collage"].get(precision, {})
            entries = [_peer(record, mode, precision) for mode in modes]
            if not run and all(entry is None for entry in entries):
                continue
            rows += 1
            where = f"{record['model']} b{record['batch']} {precision}"
            placed = _placed(run)
            collage_s = placed.get("cost", {}).get("median_s")
            fastest = _fastest(record, precision, modes)
            ratio = collage_s / fastest[1] if collage_s and fastest else None
            if ratio is not None:
                ratios.append(ratio)
            work = run.get("results", {}).get("throughput") or {}
            if work.get("peak"):
                peaks[(work["peak"]["gpu"], precision)] = work["peak"]
            if work.get("device"):
                devices.add(work["device"])
            fraction = work.get("fraction_of_peak")
            collage = f"{collage_s * 1e3:.3f}" if collage_s else (f"failed ({len(notes) + 1})" if "error" in run else "-")
            if "error" in run:
                notes.append(f"{where}, Collage: {run['error']}")
            cells = [
                record["model"],
                str(record["batch"]),
                precision,
                *[_peer_cell(entry, mode, notes, where) for entry, mode in zip(entries, modes)],
                _short(fastest[0]) if fastest else "-",
                collage,
                f"{ratio:.2f}" if ratio is not None else "-",
                operators_text(placed.get("operators_by_backend", {})) or "-",
                f"{work['flops'] / 1e9:.1f}" if "flops" in work else "-",
                f"{work['tflops']:.2f}" if "tflops" in work else "-",
                f"{100 * fraction:.1f}%" if fraction is not None else "-",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    if ratios:
        geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        verdict = f"{1 / geomean:.2f}x faster" if geomean < 1 else f"{geomean:.2f}x slower" if geomean > 1 else "level"
        lines += ["", f"Geomean of Collage / fastest peer over {len(ratios)} of {rows} rows: {geomean:.2f} (Collage {verdict})."]
    if devices:
        lines += ["", f"Collage's runs recorded the device as {'; '.join(sorted(devices))}."]
    if peaks:
        lines += [
            "",
            "Peaks: "
            + "; ".join(
                f"{peak['gpu']} {precision} {peak['tflops']:g} TFLOP/s ({peak['source']}, {peak['url']})"
                for (_, precision), peak in sorted(peaks.items())
            )
            + ".",
        ]
    if notes:
        lines += ["", *[f"{number}. {note}" for number, note in enumerate(notes, 1)]]
    return lines


def gpu_report(
    records: list[dict],
    command: str = "python benchmarks/precision.py --device cuda",
    raw: str = "benchmarks/raw-precision-cuda/",
    about: str = "",
    chart: str = "",
) -> str:
    """The GPU report of ``records``; ``about`` (the raw directory's about.md: the machine, the leases, what
    ran where) goes under the title, and its first line is the title where it starts with "# "; ``chart`` (a
    picture's file name beside the report, :func:`draw_peers_chart`) is shown under the table of every peer."""
    added = sorted({b for record in records for spec in record["collage"] for b in spec.split("+")[1:]})
    title = (
        "Collage on the GPU at fp32, bf16 and fp16 beside PyTorch at the same precisions"
        if not added
        else f"Collage on the GPU with and without {', '.join(added)}, beside PyTorch at the same precisions"
    )
    about = about.strip()
    if about.startswith("# "):  # a title of its own
        title, _, about = about[2:].partition("\n")
        about = about.strip()
    modes = _shown_modes(records)
    compiled = [f'"{_short(mode)}"' for mode in modes if mode.startswith("torch.compile")]
    lines = [
        f"# {title}",
        "",
        *([about, ""] if about else []),
        f"Command: `{command}` (raw results in `{raw}`).",
        "",
        "- Collage: `collage optimize --target cuda --precision P --backends B` (op-level search), its placement's "
        "end-to-end latency as it measured it (CUDA graphs replayed), and its verification's error (max |out - ref| "
        "over max |ref|, against ONNX Runtime at fp32 on its random inputs). FLOPs: counted from the model Collage "
        "imported (2 per multiply-add of matrix products, convolutions and attention; other operators not counted), "
        "over that latency, against the GPU's peak at the precision (fp32: CUDA cores; others: dense tensor cores).",
        f"- PyTorch: eager{' and `torch.compile` ' + ', '.join(compiled) if compiled else ''}, fp32 with TF32 off, "
        "tf32 (fp32 with PyTorch's TF32 flags on), bf16 and fp16 under CUDA autocast; median of up to 50 runs after "
        "3 warm-ups; error against eager fp32 on the benchmark's input."
        + (
            " Each peer at each precision ran in a process of its own with an empty compile cache; in parentheses, "
            "its first call's seconds (tracing, compiling and autotuning). A process still running after its time "
            "limit was stopped and is shown as timed out; the fastest peer is the fastest of those that ran."
            if any(
                "compile_s" in entry
                for record in records
                for entries in record["peers"].values()
                for entry in entries.values()
                if isinstance(entry, dict)
            )
            else ""
        ),
        "- \"bf16, budget E\": Collage with `--accuracy-budget E` (the error of its outputs at most E, measured); the peers "
        "beside it are the same bf16 runs, held to no budget.",
        *(["- \"fp16 + B\": Collage with backend B besides the section's backends, in the same run and cost database."] if added else []),
        "",
        *peers_table(records),
        "",
        *([f"![every peer's latency and Collage's over the fastest peer's, per model, batch and precision]({chart})", ""] if chart else []),
    ]
    for record in records:
        lines += [
            f"## {record['model']}, batch {record['batch']} (Collage's backends: {record['backends']})",
            "",
            "| precision | Collage (ms) | speedup over Collage fp32 | operators | "
            + " | ".join(f"{_short(mode)} (ms)" for mode in modes)
            + " | Collage / best peer | Collage error | "
            + " | ".join(f"{_short(mode)} error" for mode in modes)
            + " | Collage's run (s) |",
            "|---|---|---|---|" + "---|" * (2 * len(modes) + 3),
        ]
        others = [spec for spec in record["collage"] if spec not in GPU_PRECISIONS]
        float32_s = _placed(record["collage"].get("fp32", {})).get("cost", {}).get("median_s")
        for spec in [*GPU_PRECISIONS, *others]:
            precision = parse_run(spec, record["backends"])[0]
            run = record["collage"].get(spec, {})
            results = run.get("results", {})
            placed = _placed(run)
            cost = placed.get("cost", {})
            collage_s = cost.get("median_s")
            mix = ", ".join(f"{b} {n}" for b, n in sorted(placed.get("operators_by_backend", {}).items())) or run.get("error", "-")
            fitted = results.get("accuracy_budget")
            if fitted:
                mix += f"; {len(fitted['float32_units'])} of {fitted['units']} units in float32 ({len(fitted['probes'])} probes)"
            peers = [_peer(record, mode, precision) or {"error": "-"} for mode in modes]
            if not run and not any("median_s" in p for p in peers):
                continue  # a precision not asked for this model
            fastest = _fastest(record, precision, modes)
            numerics = results.get("numerics") or {}
            cells = [
                run_label(spec),
                f"{collage_s * 1e3:.3f}" if collage_s else "-",
                f"{float32_s / collage_s:.2f}" if collage_s and float32_s else "-",
                mix,
                *[f"{p['median_s'] * 1e3:.3f}" if "median_s" in p else p.get("error", "-") for p in peers],
                f"{collage_s / fastest[1]:.2f}" if collage_s and fastest else "-",
                f"{numerics['max_rel_error']:.2e}" if "max_rel_error" in numerics else "-",
                *[f"{p['error']:.2e}" if "error" in p and "median_s" in p else "-" for p in peers],
                f"{run['wall_s']:.0f}" if "wall_s" in run else "-",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", *[f"- {note}" for note in record.get("notes", [])], ""]
    return "\n".join(lines)


def _ms(result: dict) -> str:
    if not result or "median_s" not in result:
        return (result or {}).get("error", "-")
    return f"{result['median_s'] * 1e3:.2f} ± {result['spread_s'] * 1e3:.2f}"


def report(records: list[dict]) -> str:
    from collage_core.model.precision import FAST_BF16_FLAGS, cpu_flags, cpu_model

    model_name = cpu_model()

    lines = [
        "# Collage at fp32 and bf16 beside the peers at both precisions",
        "",
        "Command: `python benchmarks/precision.py` (raw results in `benchmarks/raw-precision/`).",
        "",
        f"- CPU: {model_name}, bf16 units: {', '.join(f for f in FAST_BF16_FLAGS if f in cpu_flags()) or 'none'}; "
        f"python {platform.python_version()}",
        "- Collage: `collage optimize --precision P --backends B`, a fresh cost database per run; "
        "its library timed in turns with the peers (`benchmarks/interleaved.py`, median ± interquartile range, ms).",
        "- Error: max |out - ref| / max |ref| on the benchmark's input against PyTorch at fp32 (Collage's own "
        "verification, on its random inputs against ONNX Runtime, is in the details).",
        "",
    ]
    for record in records:
        turns = record["in_turns"]["contenders"]
        errors = record["errors"]
        fp32 = turns.get(collage_name("fp32"), {}).get("median_s")
        lines += [
            f"## {record['model']}, batch {record['batch']} (Collage's backends: {record['backends']})",
            "",
            "| contender | precision | median ms | vs Collage fp32 | error vs fp32 reference |",
            "|---|---|---|---|---|",
        ]
        contenders = [collage_name(p) for p in PRECISIONS] + PEERS
        for contender in contenders:
            result = turns.get(contender, {})
            precision = contender[-5:-1] if contender.startswith(interleaved.COLLAGE) else PEER_PRECISION[contender]
            ratio = f"{result['median_s'] / fp32:.2f}" if fp32 and "median_s" in result else "-"
            error = f"{errors[contender]:.2e}" if contender in errors else "-"
            lines.append(f"| {contender} | {precision} | {_ms(result)} | {ratio} | {error} |")
        lines.append("")
        for precision in PRECISIONS:
            run = record["collage"][precision]
            if "error" in run:
                lines.append(f"- Collage {precision}: {run['error']}")
                continue
            results = run["results"]
            placed = results["end_to_end"][0]
            mix = ", ".join(f"{b} {n}" for b, n in sorted(placed["operators_by_backend"].items()))
            numerics = results.get("numerics") or {}
            lines.append(
                f"- Collage {precision}: {mix}; cold run {run['wall_s']:.0f} s; its verification: max error "
                f"{numerics.get('max_rel_error', float('nan')):.2e} of the output scale (tolerance rtol "
                f"{numerics.get('rtol')}, {'passed' if numerics.get('passed') else 'FAILED'})"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert-base,resnet50")
    parser.add_argument("--batches", default="1")
    parser.add_argument(
        "--backends", default=None, help="Collage's backends (default: tvm,dnnl,onnxruntime,openvino; with --device cuda tvm,cublas,cudnn)"
    )
    parser.add_argument("--raw", type=Path, default=None, help="default: benchmarks/raw-precision[-cuda]")
    parser.add_argument("--report", type=Path, default=None, help="default: benchmarks/PRECISION[-cuda].md")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--precisions",
        default=",".join(DEFAULT_GPU_PRECISIONS),
        help="with --device cuda: Collage's runs to make; P@E runs precision P with --accuracy-budget E, P/nhwc with "
        "--layout nhwc (P/model: --layout model; plain P: the default, auto), P+B adds backend B",
    )
    parser.add_argument("--compare", action="store_true", help="with --device cuda: Collage's runs also measure each backend alone")
    parser.add_argument(
        "--modes",
        default=",".join(DEFAULT_GPU_MODES),
        help=f"with --device cuda: the PyTorch peers, 'all' for every one ({', '.join(GPU_MODES)})",
    )
    parser.add_argument("--only", choices=["peers", "collage"], default="", help="with --device cuda: measure only these")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="with --device cuda: start nothing, and stop what runs, past this many seconds; a run cut "
        "short is not recorded and the next call measures it (for machines lent by the call)",
    )
    parser.add_argument(
        "--peer-timeout-s",
        type=float,
        default=PEER_TIMEOUT_S,
        help="with --device cuda: a peer's process still running after this long is recorded as timed out",
    )
    parser.add_argument("--retry-failed", action="store_true", help="with --device cuda: measure again what failed or timed out")
    parser.add_argument(
        "--cost-dbs",
        type=Path,
        default=None,
        help="with --device cuda: the folder of Collage's cost databases, one per model and batch (default: under the temporary "
        "directory); a run cut short by --budget-s resumes from it",
    )
    parser.add_argument(
        "--collage-args", default="", help="with --device cuda: more arguments for every collage optimize, as one string ('--budget 240')"
    )
    parser.add_argument("--only-report", action="store_true")
    parser.add_argument(
        "--again",
        default="",
        help="CPU: make these precisions' Collage runs anew and time everything in turns again, the other precisions' libraries kept",
    )
    args = parser.parse_args()
    if args.device == "cuda":
        raw = args.raw or HERE / "raw-precision-cuda"
        modes = GPU_MODES if args.modes == "all" else tuple(args.modes.split(","))
        unknown = [mode for mode in modes if mode not in GPU_MODES]
        if unknown:
            parser.error(f"--modes: {', '.join(unknown)}: the peers are {', '.join(GPU_MODES)}")
        budget = Budget(args.budget_s)
        records = []
        for name in args.models.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                path = raw / f"{_stem(name, batch)}.json"
                if args.only_report:
                    records += [json.loads(path.read_text())] if path.exists() else []
                else:
                    records.append(
                        measure_on_gpu(
                            name,
                            batch,
                            args.backends or "tvm,cublas,cudnn",
                            raw,
                            args.precisions.split(","),
                            args.compare,
                            modes,
                            args.only,
                            budget,
                            args.peer_timeout_s,
                            args.retry_failed,
                            args.cost_dbs,
                            tuple(shlex.split(args.collage_args)),
                        )
                    )
        if not args.only_report:
            left = [
                item
                for record in records
                for item in left_to_measure(record, args.precisions.split(","), modes, args.only, args.retry_failed)
            ]
            print(
                f"{len(left)} left to measure ({', '.join(left)}): run the same command again" if left else "nothing left to measure",
                flush=True,
            )
        shown = [a for a in sys.argv[1:] if a not in ("--only-report", "--retry-failed")]
        about = raw / ABOUT_FILE
        report = args.report or HERE / "PRECISION-cuda.md"
        chart = report.with_suffix(".png")
        text = gpu_report(
            records,
            shlex.join(["python", "benchmarks/precision.py", *shown]),
            f"{raw.relative_to(ROOT) if raw.is_relative_to(ROOT) else raw}/",
            about.read_text() if about.is_file() else "",
            chart.name if draw_peers_chart(records, chart) else "",
        )
        report.write_text(text + "\n")
        print(text)
        return
    args.raw = args.raw or HERE / "raw-precision"
    args.backends = args.backends or "tvm,dnnl,onnxruntime,openvino"
    records = []
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            path = args.raw / f"{_stem(name, batch)}.json"
            if args.only_report:
                if path.exists():
                    records.append(json.loads(path.read_text()))
                continue
            records.append(measure(name, batch, args.backends, args.raw, tuple(args.again.split(",")) if args.again else ()))
    text = report(records)
    (args.report or HERE / "PRECISION.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
