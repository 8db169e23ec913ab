"""Collage at fp32 and at bf16 (and fp16 on a GPU) beside the peers at the same precisions, in one run.

    python benchmarks/precision.py [--models bert-base,resnet50] [--batches 1] [--backends tvm,dnnl,onnxruntime,openvino]
                                   [--raw benchmarks/raw-precision] [--only-report]
    python benchmarks/precision.py --device cuda [--models ...] [--backends tvm,cublas,cudnn]
                                   [--precisions fp32,bf16,fp16,bf16@1e-3,fp16+cutlass] [--raw DIR --report FILE]

For each model and batch: ``collage optimize --precision fp32`` and ``--precision bf16`` with the same
backends and Collage's default search (fresh cost database each), then Collage's two libraries, ONNX Runtime's
default session (fp32), PyTorch eager at fp32 and with CPU bf16 autocast, and OpenVINO with its inference
precision hint at f32 and at bf16, timed in turns (``benchmarks/interleaved.py``). Every contender's error
is measured on the same input against PyTorch at fp32: max |out - ref| over max |ref|. Resumable: each
model's results are kept in ``--raw`` as they are measured. Writes ``benchmarks/PRECISION.md``.
Needs a CPU with AMX or AVX512-BF16 (Collage refuses bf16 elsewhere).

With ``--device cuda``: Collage with ``--target cuda`` at fp32, bf16 and fp16 (its own end-to-end
measurement, replaying CUDA graphs, and its verification's error against ONNX Runtime), and PyTorch
eager and ``torch.compile`` "reduce-overhead" at fp32 (TF32 off) and under CUDA autocast at bf16 and
fp16 (and at tf32, float32 with PyTorch's TF32 flags on), each timed in its own process after a warm-up, with its error against eager fp32 on the same input.
``P@E`` among ``--precisions`` adds a Collage run at precision P
held to ``--accuracy-budget E``, compared with the peers at P; ``P+B`` adds a run at P with backend B
besides ``--backends`` (``fp16+cutlass``: what CUTLASS adds, in the same run and cost database). The GPU is not shared, so nothing there needs timing in turns. Raw results in ``<raw>-cuda/``; the
report goes to ``benchmarks/PRECISION-cuda.md``, with ``<raw>/about.md`` (the machine, the leases, what ran where)
under its title when that file exists.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "scripts"))
import interleaved  # noqa: E402
from peers import _onnx_file, _stem  # noqa: E402

PRECISIONS = ("fp32", "bf16")
PEERS = ["onnxruntime default session", "pytorch eager", interleaved.TORCH_BF16, *interleaved.OPENVINO_PRECISIONS]
PEER_PRECISION = {"onnxruntime default session": "fp32", "pytorch eager": "fp32", interleaved.TORCH_BF16: "bf16",
                  "openvino default session (fp32)": "fp32", "openvino default session (bf16)": "bf16"}


GPU_PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
DEFAULT_GPU_PRECISIONS = ("fp32", "bf16", "fp16")
GPU_MODES = ("pytorch eager", "torch.compile reduce-overhead")
GPU_PEER_CODE = r"""
import json, sys, time
import numpy as np
import torch
sys.path.insert(0, sys.argv[4])
import make_hf_models as models
name, batch, mode, asked = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[5].split(",")
torch.backends.cuda.matmul.allow_tf32 = False  # fp32 is float32 as Collage computes it
torch.backends.cudnn.allow_tf32 = False
model, example, _ = models.module_and_input(name, batch)
model, example = model.cuda(), example.cuda()
first = lambda out: (out if isinstance(out, torch.Tensor) else out[0]).float()
with torch.inference_mode():
    reference = first(model(example))
results = {}
for precision, dtype in (("fp32", None), ("tf32", None), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
    if precision not in asked:
        continue
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"  # TF32 tensor cores
    torch._dynamo.reset()  # else a compiled graph of the precision before is reused: dynamo does not guard on autocast's dtype
    run_model = torch.compile(model, mode="reduce-overhead") if mode.startswith("torch.compile") else model
    def function():
        with torch.inference_mode(), torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            out = run_model(example)
        torch.cuda.synchronize()
        return out
    started = time.perf_counter()
    for _ in range(3):
        out = function()
    setup_s = time.perf_counter() - started
    error = float((first(out) - reference).abs().max() / reference.abs().max())
    samples = []
    while len(samples) < 50 and sum(samples) < 10.0:
        begin = time.perf_counter()
        function()
        samples.append(time.perf_counter() - begin)
    q1, median, q3 = np.percentile(samples, [25, 50, 75])
    results[precision] = {"median_s": float(median), "spread_s": float(q3 - q1), "repeats": len(samples),
                          "setup_s": setup_s, "error": error}
print(json.dumps(results))
"""


def collage_name(precision: str) -> str:
    return f"{interleaved.COLLAGE} ({precision})"


def optimize(onnx: Path, precision: str, backends: str, out: Path, extra: tuple = (), cost_db: Path | None = None) -> dict:
    started = time.perf_counter()
    # The search is Collage's default: two-level where a graph-level backend is among ``backends``, else op-level.
    command = [sys.executable, "-m", "collage_core", "optimize", str(onnx), "--precision", precision, "--backends", backends,
               "--output", str(out), "--cost-db", str(cost_db or out / "costs.sqlite"), *extra]
    last = "failed"
    with subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True) as process:
        for line in process.stderr:  # its progress shows as it goes; the last line names a failure
            sys.stderr.write(line)
            last = line.strip() or last
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
    from collage_core.deploy import load_vm

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
    """A ``--precisions`` entry (``P``, ``P@E``, ``P+B[+B...]``) as (precision, accuracy budget or "", backends)."""
    base, *added = spec.split("+")
    precision, _, budget = base.partition("@")
    if precision not in GPU_PRECISIONS:
        raise ValueError(f"{spec!r}: the precision is one of {', '.join(GPU_PRECISIONS)}")
    return precision, budget, ",".join([*backends.split(","), *(b for b in added if b not in backends.split(","))])


def run_label(spec: str) -> str:
    """How a run's row is named: ``fp16``, ``bf16, budget 2e-3``, ``fp16 + cutlass``."""
    base, *added = spec.split("+")
    precision, _, budget = base.partition("@")
    return (f"{precision}, budget {budget}" if budget else precision) + "".join(f" + {b}" for b in added)


ABOUT_FILE = "about.md"  # beside a GPU run's raw records: what the report says under its title


def measure_on_gpu(name: str, batch: int, backends: str, raw: Path, precisions=DEFAULT_GPU_PRECISIONS, compare: bool = False) -> dict:
    """Collage at each precision on the GPU and the PyTorch peers at each precision, kept as each is measured.

    Collage's runs of one model and batch share a cost database (its keys hold the precision, so nothing is
    mixed up): an accuracy budget's probes reuse what the plain runs measured. Single-backend baselines are
    left out unless ``compare``: the comparison here is with the peers."""
    path = raw / f"{_stem(name, batch)}.json"
    record = json.loads(path.read_text()) if path.exists() else {"model": name, "batch": batch, "backends": backends,
                                                                  "collage": {}, "peers": {}}
    raw.mkdir(parents=True, exist_ok=True)

    def keep():
        path.write_text(json.dumps(record, indent=1, default=str) + "\n")

    onnx = _onnx_file(name, batch)
    asked = sorted({parse_run(spec, backends)[0] for spec in precisions}, key=GPU_PRECISIONS.index)
    cost_db = Path(tempfile.gettempdir()) / "collage-precision" / f"{_stem(name, batch)}.sqlite"
    cost_db.parent.mkdir(parents=True, exist_ok=True)
    for mode in GPU_MODES:
        if any(p not in record["peers"].get(mode, {}) for p in asked):
            print(f"{name} b{batch}: {mode} at {', '.join(asked)}", flush=True)
            done = subprocess.run([sys.executable, "-c", GPU_PEER_CODE, name, str(batch), mode, str(ROOT / "scripts"),
                                   ",".join(asked)], cwd=ROOT, capture_output=True, text=True)
            measured = (json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else
                        {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]})
            # The precisions measured before stay: a run asking for others adds to them.
            record["peers"][mode] = {**{p: r for p, r in record["peers"].get(mode, {}).items() if p != "error"}, **measured}
            keep()
    for spec in precisions:  # "bf16", with an accuracy budget "bf16@1e-3", with another backend "fp16+cutlass"
        if spec not in record["collage"]:
            precision, budget, run_backends = parse_run(spec, backends)
            extra = ("--target", "cuda", *(("--accuracy-budget", budget) if budget else ()), *(() if compare else ("--no-compare",)))
            print(f"{name} b{batch}: collage optimize {' '.join(extra)} --precision {precision} --backends {run_backends}", flush=True)
            out = Path(tempfile.mkdtemp(prefix=f"precision-{name}-")) / spec.replace("@", "-").replace("+", "-")
            record["collage"][spec] = optimize(onnx, precision, run_backends, out, extra, cost_db)
            keep()
    return record


def _placed(run: dict) -> dict:
    """The end-to-end entry of the placement a Collage run returned ({} if it has none)."""
    return (run.get("results", {}).get("end_to_end") or [{}])[0]


def gpu_report(records: list[dict], command: str = "python benchmarks/precision.py --device cuda",
               raw: str = "benchmarks/raw-precision-cuda/", about: str = "") -> str:
    """The GPU report of ``records``; ``about`` (the raw directory's about.md: the machine, the leases, what
    ran where) goes under the title, and its first line is the title where it starts with "# "."""
    added = sorted({b for record in records for spec in record["collage"] for b in spec.split("+")[1:]})
    title = ("Collage on the GPU at fp32, bf16 and fp16 beside PyTorch at the same precisions" if not added else
             f"Collage on the GPU with and without {', '.join(added)}, beside PyTorch at the same precisions")
    about = about.strip()
    if about.startswith("# "):  # a title of its own
        title, _, about = about[2:].partition("\n")
        about = about.strip()
    lines = [f"# {title}", "", *([about, ""] if about else []), f"Command: `{command}` (raw results in `{raw}`).", "",
             "- Collage: `collage optimize --target cuda --precision P --backends B` (op-level search), its placement's "
             "end-to-end latency as it measured it (CUDA graphs replayed), and its verification's error (max |out - ref| "
             "over max |ref|, against ONNX Runtime at fp32 on its random inputs).",
             "- PyTorch: eager and `torch.compile` \"reduce-overhead\", fp32 with TF32 off, tf32 (fp32 with PyTorch's "
             "TF32 flags on), bf16 and fp16 under CUDA autocast; median of up to 50 runs after 3 warm-ups; error against eager fp32 on the benchmark's input.",
             "- \"bf16, budget E\": Collage with `--accuracy-budget E` (the error of its outputs at most E, measured); the peers "
             "beside it are the same bf16 runs, held to no budget.",
             *(["- \"fp16 + B\": Collage with backend B besides the section's backends, in the same run and cost database."]
               if added else []), ""]
    for record in records:
        lines += [f"## {record['model']}, batch {record['batch']} (Collage's backends: {record['backends']})", "",
                  "| precision | Collage (ms) | speedup over Collage fp32 | operators | eager (ms) | reduce-overhead (ms) | "
                  "Collage / best peer | Collage error | eager error | reduce-overhead error | Collage's run (s) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
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
            peers = [record["peers"].get(mode, {}).get(precision) or {"error": record["peers"].get(mode, {}).get("error", "-")}
                     for mode in GPU_MODES]
            if not run and not any("median_s" in p for p in peers):
                continue  # a precision not asked for this model
            best = min((p["median_s"] for p in peers if "median_s" in p), default=None)
            numerics = results.get("numerics") or {}
            cells = [run_label(spec), f"{collage_s * 1e3:.3f}" if collage_s else "-",
                     f"{float32_s / collage_s:.2f}" if collage_s and float32_s else "-", mix,
                     *[f"{p['median_s'] * 1e3:.3f}" if "median_s" in p else p.get("error", "-") for p in peers],
                     f"{collage_s / best:.2f}" if collage_s and best and all("median_s" in p for p in peers) else "-",
                     f"{numerics['max_rel_error']:.2e}" if "max_rel_error" in numerics else "-",
                     *[f"{p['error']:.2e}" if "error" in p and "median_s" in p else "-" for p in peers],
                     f"{run['wall_s']:.0f}" if "wall_s" in run else "-"]
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", *[f"- {note}" for note in record.get("notes", [])], ""]
    return "\n".join(lines)


def _ms(result: dict) -> str:
    if not result or "median_s" not in result:
        return (result or {}).get("error", "-")
    return f"{result['median_s'] * 1e3:.2f} ± {result['spread_s'] * 1e3:.2f}"


def report(records: list[dict]) -> str:
    from collage_core.precision import FAST_BF16_FLAGS, cpu_flags, cpu_model

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
        lines += [f"## {record['model']}, batch {record['batch']} (Collage's backends: {record['backends']})", "",
                  "| contender | precision | median ms | vs Collage fp32 | error vs fp32 reference |",
                  "|---|---|---|---|---|"]
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
                f"{numerics.get('rtol')}, {'passed' if numerics.get('passed') else 'FAILED'})")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert-base,resnet50")
    parser.add_argument("--batches", default="1")
    parser.add_argument("--backends", default=None,
                        help="Collage's backends (default: tvm,dnnl,onnxruntime,openvino; with --device cuda tvm,cublas,cudnn)")
    parser.add_argument("--raw", type=Path, default=None, help="default: benchmarks/raw-precision[-cuda]")
    parser.add_argument("--report", type=Path, default=None, help="default: benchmarks/PRECISION[-cuda].md")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precisions", default=",".join(DEFAULT_GPU_PRECISIONS),
                        help="with --device cuda: Collage's runs to make; P@E runs precision P with --accuracy-budget E")
    parser.add_argument("--compare", action="store_true", help="with --device cuda: Collage's runs also measure each backend alone")
    parser.add_argument("--only-report", action="store_true")
    parser.add_argument("--again", default="", help="CPU: make these precisions' Collage runs anew and time everything in "
                                                    "turns again, the other precisions' libraries kept")
    args = parser.parse_args()
    if args.device == "cuda":
        raw = args.raw or HERE / "raw-precision-cuda"
        records = []
        for name in args.models.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                path = raw / f"{_stem(name, batch)}.json"
                if args.only_report:
                    records += [json.loads(path.read_text())] if path.exists() else []
                else:
                    records.append(measure_on_gpu(name, batch, args.backends or "tvm,cublas,cudnn", raw,
                                                  args.precisions.split(","), args.compare))
        shown = [a for a in sys.argv[1:] if a != "--only-report"]
        about = raw / ABOUT_FILE
        text = gpu_report(records, " ".join(["python benchmarks/precision.py", *shown]),
                          f"{raw.relative_to(ROOT) if raw.is_relative_to(ROOT) else raw}/",
                          about.read_text() if about.is_file() else "")
        (args.report or HERE / "PRECISION-cuda.md").write_text(text + "\n")
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
