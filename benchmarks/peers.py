"""Collage against the peers on this CPU or an NVIDIA GPU, on models from published architectures, in one resumable run.

    python benchmarks/peers.py [--models mobilenetv2,resnet50,convnext-tiny,bert-base,vit-base,gpt2]
                               [--batches 1,8] [--torch-batches 1] [--raw benchmarks/raw] [--only-report]
                               [--collage-again] [--device cpu|cuda] [--set public|families]

With ``--set families`` (the CPU): the models of ``FAMILIES`` in ``scripts/make_hf_models.py``, families beyond
the six public models at their published full-size configurations, at batch 1 and fed as ONNX files only
(``--models`` picks among them); raw results in ``benchmarks/raw-families``, and RESULTS.md gets a section of
their own after the public models' (its chart ``benchmarks/results-families.png``).

With ``--device cuda`` (on a machine with an NVIDIA GPU; results in ``benchmarks/raw-cuda``): PyTorch
eager, torch.compile and torch.compile's "reduce-overhead" mode (its CUDA graphs) on CUDA (float32,
TF32 off) and Collage's cold run with ``--target cuda --backends tvm,cublas,cudnn``, whose placement
replays as CUDA graphs and which measures beside it the same placement without graphs, each backend
alone (cuBLAS and cuDNN with TVM for the rest) and TVM's unpartitioned build. RESULTS.md gets a section of
its own for the GPU rows, with the GPU and the library versions the run recorded, after the table of every
torch.compile mode against Collage at fp32 and bf16 (``benchmarks/TORCH-COMPILE-cuda.md``, written by
``precision.py --device cuda --modes all``) and before the other reports ``precision.py --device cuda`` wrote.

For each batch size, each model (every model at batch 1 first), in this order and each in a fresh process:
  peers            ONNX Runtime and OpenVINO (default sessions; OpenVINO in fp32), PyTorch eager, torch.compile (inductor)
  collage (cold)   `collage optimize --budget 240` with every installed backend and an empty cost database:
                   the two-level placement, the op-level placement, each backend alone (TVM; DNNL
                   with TVM for the rest; ONNX Runtime) and TVM's unpartitioned build
  collage (warm)   the same command again on the now warm cost database: it replays the search and
                   the baselines from the database and measures only its result
  interleaved      Collage's library, the peers and the best single backend (rebuilt from the placement
                   file the warm run kept, unless it is Collage's own placement) timed in turns
                   (benchmarks/interleaved.py): the headline numbers, immune to the machine's speed
                   drifting between configurations
  collage (torch)  `optimize` fed the PyTorch module instead of the ONNX file (op-level, same cost
                   database; at the --torch-batches sizes)

Every result lands in ``<raw>/<model>/<config>.json`` as soon as it is measured and is not
measured again, so an interrupted run resumes where it stopped; untuned TVM takes minutes per
run on the larger models. Each row records the commit it was measured at; after a change to
Collage, ``--collage-again`` measures again Collage's rows that other Collage code measured, and
keeps the peers'. The models are built by ``scripts/make_hf_models.py`` (HuggingFace
``transformers`` configs, seeded random weights, offline). Then ``benchmarks/RESULTS.md`` (the
tables, the machine, the versions, the command) and ``benchmarks/results.png`` are written from
the raw files; nothing in them is typed by hand.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers_report  # noqa: E402
from gpu_report import GPU_PEERS, append_gpu_section  # noqa: E402
from peers_report import PEERS, raw_file, single_backend_row, write_report  # noqa: E402

MODELS = ["mobilenetv2", "resnet50", "convnext-tiny", "bert-base", "vit-base", "gpt2"]
FAMILIES_RAW = ROOT / "benchmarks" / "raw-families"
FAMILIES_COMMAND = "python benchmarks/peers.py --set families"


def family_models() -> list[str]:
    """The families of ``scripts/make_hf_models.py``'s FAMILIES, in its order."""
    sys.path.insert(0, str(SCRIPTS))
    import make_hf_models

    return list(make_hf_models.FAMILIES)


RUN_TIMEOUT_S = 6 * 3600
# What depends on Collage's code, measured again with --collage-again where that code changed.
COLLAGE_CONFIGS = ("collage cold", "collage warm", "interleaved", "collage torch input")
COLLAGE_CODE = ("collage_core", "plugins/*/collage_*", "pyproject.toml", "plugins/*/pyproject.toml")  # its packages
TWO_LEVEL_BUDGET_S = 240  # the two-level search's time budget (`collage optimize --budget`)
# On an NVIDIA GPU: the peers there, and Collage over the GPU backends, measured once (cold): GPU
# latencies do not drift between minutes as this 2-core machine's do, so nothing is timed in turns.
GPU_BACKENDS = "tvm,cublas,cudnn"

PEER_CODE = r"""
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[4])
import make_hf_models as models
name, batch, peer = sys.argv[1], int(sys.argv[2]), sys.argv[3]
model, example, input_name = models.module_and_input(name, batch)

def timed(function, warmup=3, repeats=15, bound_s=60.0):
    for _ in range(warmup):
        function()
    samples, started = [], time.perf_counter()
    while len(samples) < repeats and (len(samples) < 5 or time.perf_counter() - started < bound_s):
        begin = time.perf_counter()
        function()
        samples.append(time.perf_counter() - begin)
    q1, median, q3 = np.percentile(samples, [25, 50, 75])
    return {"median_s": float(median), "spread_s": float(q3 - q1), "repeats": len(samples)}

setup = time.perf_counter()
on_gpu = peer.endswith("(cuda)")
if on_gpu:
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 as Collage computes it
    torch.backends.cudnn.allow_tf32 = False
    model, example = model.cuda(), example.cuda()
if peer == "onnxruntime default session":
    import onnxruntime
    session = onnxruntime.InferenceSession(sys.argv[5], providers=["CPUExecutionProvider"])
    feeds = {input_name: example.numpy()}
    function = lambda: session.run(None, feeds)
elif peer == "openvino default session (fp32)":
    import openvino
    compiled = openvino.Core().compile_model(sys.argv[5], "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    request, feeds = compiled.create_infer_request(), {input_name: example.numpy()}
    function = lambda: request.infer(feeds)
else:
    import torch
    if peer.startswith("torch.compile"):
        # "reduce-overhead": inductor's kernels replayed as CUDA graphs (its own answer to launch overhead).
        model = torch.compile(model, mode="reduce-overhead" if "reduce-overhead" in peer else "default")
    def function():
        with torch.inference_mode():
            model(example)
        if on_gpu:
            torch.cuda.synchronize()
function()
result = {"setup_s": time.perf_counter() - setup}
result.update(timed(function))
print(json.dumps(result))
"""

TORCH_INPUT_CODE = r"""
import json, sys, time
sys.path.insert(0, sys.argv[3])
import make_hf_models as models
import collage_core
model, example, _ = models.module_and_input(sys.argv[1], int(sys.argv[2]))
started = time.perf_counter()
result = collage_core.optimize(model, example_inputs=(example,), search="op-level", cost_db=sys.argv[4],
                               compare_backends=False, show_progress=False)
row = result.results_json()
row["wall_s"] = time.perf_counter() - started
print(json.dumps(row))
"""


def _stem(name: str, batch: int) -> str:
    sys.path.insert(0, str(SCRIPTS))
    import make_hf_models

    return make_hf_models.file_stem(name, batch)


def _onnx_file(name: str, batch: int) -> Path:
    path = ROOT / "models" / "hf" / f"{_stem(name, batch)}.onnx"
    if not path.exists():
        subprocess.run([sys.executable, str(SCRIPTS / "make_hf_models.py"), "--model", name, "--batch", str(batch)], check=True, cwd=ROOT)
    return path


def _commit() -> str:
    """The Collage commit measured (with "+changes" when the work tree differs from it)."""

    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return ""
    changed = git("status", "--porcelain", "--untracked-files=no", "--", "collage_core", "plugins", "benchmarks/*.py")
    return commit + ("+changes" if changed else "")


def same_collage_code(commit: Optional[str]) -> bool:
    """Whether Collage's code (``COLLAGE_CODE``) at ``commit``, as a raw row records it, is what
    runs now: no commit, a commit with uncommitted changes, or an unknown one count as different."""
    if not commit or commit.endswith("+changes"):
        return False
    for diff in (["diff", "--quiet", commit, "HEAD", "--", *COLLAGE_CODE], ["diff", "--quiet", "HEAD", "--", *COLLAGE_CODE]):
        if subprocess.run(["git", *diff], cwd=ROOT, capture_output=True).returncode != 0:
            return False
    return True


def _json_line(command: list[str], env=None) -> dict:
    run = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=ROOT, env=env)
    if run.returncode != 0:
        lines = [line for line in run.stderr.strip().splitlines() if line.strip()]
        return {"error": lines[-1] if lines else f"exit code {run.returncode}"}
    return json.loads(run.stdout.strip().splitlines()[-1])


class RawResults:
    """``<raw>/<model stem>/<config>.json``: one file per measured configuration, never measured twice."""

    def __init__(self, root: Path, stem: str):
        self.directory = root / stem
        self.directory.mkdir(parents=True, exist_ok=True)

    def path(self, config: str) -> Path:
        return raw_file(self.directory, config)

    def forget_stale_collage(self, is_current) -> list[str]:
        """Remove what Collage measured here with other code (``is_current(commit)`` is False for
        the commit a row records), so that it is measured again; returns the configurations
        removed. The peers' rows stay. A stale cold run takes everything of Collage's with it (its
        cost database, library and explanation), as the later runs reuse them. Rows measured with
        the current code stay, so an interrupted re-measurement resumes."""

        def current(config):
            return is_current(json.loads(self.path(config).read_text()).get("commit"))

        cold_current = self.path("collage cold").exists() and current("collage cold")
        stale = [config for config in COLLAGE_CONFIGS if self.path(config).exists() and not (cold_current and current(config))]
        for config in stale:
            self.path(config).unlink()
        if stale:
            (self.directory / "explanation.txt").unlink(missing_ok=True)
        if not cold_current:
            for path in self.directory.glob("costs.sqlite*"):
                path.unlink()
            shutil.rmtree(self.directory / "collage-out", ignore_errors=True)
        return stale

    def get_or_measure(self, config: str, measure) -> dict:
        path = self.path(config)
        if path.exists():
            return json.loads(path.read_text())
        print(f"  measuring {config} ...", flush=True)
        commit, started = _commit(), time.perf_counter()  # the code as it was when the measurement began
        result = measure()
        result.setdefault("wall_s", time.perf_counter() - started)
        result.setdefault("commit", commit)
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        partial.replace(path)
        return result


MACHINE_CODE = r"""
import json, subprocess, torch
from collage_core.backends import discover_backends
from collage_core.plugins import get_plugin_manager
props = torch.cuda.get_device_properties(0)
driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
versions = {name: info.backend.version for name, info in discover_backends(get_plugin_manager()).items() if "cuda" in info.backend.device_kinds}
print(json.dumps({"gpu": f"{props.name} (sm_{props.major}{props.minor})", "driver": driver, "torch": torch.__version__,
                  "torch_cudnn": torch.backends.cudnn.version(), "backends": ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))}))
"""


def record_gpu_machine(raw_root: Path) -> None:
    """The GPU, driver and library versions of this run, beside its results (``machine.json``)."""
    (raw_root / "machine.json").write_text(json.dumps(_json_line([sys.executable, "-c", MACHINE_CODE]), indent=1) + "\n")


def measure_model_on_gpu(name: str, batch: int, raw_root: Path) -> None:
    """The GPU peers and Collage's cold run over TVM, cuBLAS and cuDNN (it measures each backend alone beside its placement)."""
    stem = _stem(name, batch)
    print(f"{stem} (cuda):", flush=True)
    raw = RawResults(raw_root, stem)
    onnx_path = _onnx_file(name, batch)
    for peer in GPU_PEERS:
        raw.get_or_measure(
            peer, lambda: _json_line([sys.executable, "-c", PEER_CODE, name, str(batch), peer, str(SCRIPTS), str(onnx_path)])
        )
    raw.get_or_measure(
        "collage cold",
        lambda: _collage_run(
            onnx_path,
            raw.directory / "costs.sqlite",
            raw.directory / "collage-out",
            ["--target", "cuda", "--backends", GPU_BACKENDS],
            budget=False,
        ),
    )


def measure_model(
    name: str, batch: int, raw_root: Path, torch_input: bool = True, collage_again: bool = False, backends: Optional[str] = None
) -> None:
    stem = _stem(name, batch)
    print(f"{stem}:", flush=True)
    raw = RawResults(raw_root, stem)
    if collage_again:
        forgotten = raw.forget_stale_collage(same_collage_code)
        if forgotten:
            print(f"  measuring again (measured with other Collage code): {', '.join(forgotten)}", flush=True)
    onnx_path = _onnx_file(name, batch)
    for peer in PEERS:
        raw.get_or_measure(
            peer, lambda: _json_line([sys.executable, "-c", PEER_CODE, name, str(batch), peer, str(SCRIPTS), str(onnx_path)])
        )
    costs = raw.directory / "costs.sqlite"
    out = raw.directory / "collage-out"

    def collage(extra: list[str]):
        return lambda: _collage_run(onnx_path, costs, out, extra)

    chosen = ["--backends", backends] if backends else []
    raw.get_or_measure("collage cold", collage(chosen))
    warm = raw.get_or_measure("collage warm", collage(chosen))

    def interleaved():
        single_name, single = _best_single_library(warm, onnx_path, out, stem)
        result = _json_line(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "interleaved.py"),
                name,
                str(batch),
                str(out / f"{stem}.so"),
                *(["--single", str(single)] if single else []),
            ]
        )
        return {**result, "single": single_name}

    raw.get_or_measure("interleaved", interleaved)
    if not torch_input:
        return
    raw.get_or_measure(
        "collage torch input", lambda: _json_line([sys.executable, "-c", TORCH_INPUT_CODE, name, str(batch), str(SCRIPTS), str(costs)])
    )


def _best_single_library(warm: dict, onnx_path: Path, out: Path, stem: str):
    """(name, library) of the fastest single-backend baseline the warm run measured, rebuilt from its
    placement file; library None when that baseline is the placement Collage returned (or it failed)."""
    rows = [e for e in warm.get("end_to_end", []) if single_backend_row(e["name"]) and e["cost"]["kind"] == "measured"]
    if not rows:
        return None, None
    best = min(rows, key=lambda e: e["cost"]["median_s"])
    returned = next(e for e in warm["end_to_end"] if e["name"] == "placement")
    if best["operators_by_backend"] == returned["operators_by_backend"]:
        return best["name"], None
    from collage_core.search.baselines import baseline_file

    built = out / "best-single"
    run = subprocess.run(
        [
            "collage",
            "optimize",
            str(onnx_path),
            "--placement",
            str(baseline_file(out, best["name"])),
            "--no-compare",
            "--output",
            str(built),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=RUN_TIMEOUT_S,
    )
    if run.returncode != 0:
        print(f"  building {best['name']} failed: {run.stderr.strip().splitlines()[-1:]}", flush=True)
        return best["name"], None
    return best["name"], built / f"{stem}.so"


def _collage_run(onnx_path: Path, costs: Path, out: Path, extra: list[str], budget: bool = True) -> dict:
    started = time.perf_counter()
    budget_args = ["--budget", str(TWO_LEVEL_BUDGET_S)] if budget else []
    log = out.parent / "collage-log.txt"  # written as the run goes: an interrupted run leaves how far it got
    with log.open("w") as stderr:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "collage_core",
                "optimize",
                str(onnx_path),
                "--cost-db",
                str(costs),
                "--output",
                str(out),
                *budget_args,
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
            timeout=RUN_TIMEOUT_S,
            cwd=ROOT,
        )
    if run.returncode != 0:
        lines = [line for line in log.read_text().strip().splitlines() if line.strip()]
        return {"error": lines[-1] if lines else f"exit code {run.returncode}"}
    result = json.loads((out / "results.json").read_text())
    result["wall_s"] = time.perf_counter() - started
    return result


# What benchmarks/precision.py --device cuda wrote, appended to RESULTS.md: the precisions, CUTLASS's rows, TF32's.
GPU_PRECISION_REPORTS = (
    ROOT / "benchmarks" / "PRECISION-cuda.md",
    ROOT / "benchmarks" / "CUTLASS-cuda.md",
    ROOT / "benchmarks" / "TF32-cuda.md",
)
# Every torch.compile mode against Collage at fp32 and bf16 (precision.py --device cuda --modes all): the GPU part's first table.
TORCH_COMPILE_REPORT = ROOT / "benchmarks" / "TORCH-COMPILE-cuda.md"


def append_file(report: Path, written: Path) -> None:
    """``written`` (a report of its own) at the end of ``report``, when it exists."""
    if written.exists():
        report.write_text(report.read_text().rstrip("\n") + "\n\n" + written.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--set",
        choices=("public", "families"),
        default="public",
        help="families: the models of more families at batch 1, raw results in benchmarks/raw-families",
    )
    parser.add_argument("--models", default=None, help=f"default: {','.join(MODELS)} (with --set families, all of them)")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument(
        "--torch-batches",
        default="1",
        help="batch sizes at which Collage is also fed the PyTorch module (its own measurements: 2-10 minutes)",
    )
    parser.add_argument("--raw", type=Path, default=None, help="default: benchmarks/raw (benchmarks/raw-cuda with --device cuda)")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: on an NVIDIA GPU, PyTorch eager and torch.compile against Collage over TVM, cuBLAS and cuDNN",
    )
    parser.add_argument(
        "--backends",
        default=None,
        help="Collage's backends on the CPU (default: Collage's default, every available backend "
        "but the opt-in ones; name inductor here to include it)",
    )
    parser.add_argument("--only-report", action="store_true", help="write RESULTS.md and the chart from the raw files")
    parser.add_argument(
        "--collage-again",
        action="store_true",
        help="measure Collage's rows again where Collage's code changed since (its cold and warm "
        "runs, the turns, the PyTorch-input run); the peers' rows are kept; resumable",
    )
    args = parser.parse_args()
    families = args.set == "families"
    if families:
        if args.device != "cpu":
            raise SystemExit("--set families is measured on the CPU")
        args.batches, args.torch_batches = "1", ""
        args.raw = args.raw or FAMILIES_RAW
    args.models = args.models or ",".join(family_models() if families else MODELS)
    if args.device == "cpu" and shutil.which("collage") is None:
        raise SystemExit("the collage command is not installed: ./scripts/setup.sh")
    cpu_raw, gpu_raw = ROOT / "benchmarks" / "raw", ROOT / "benchmarks" / "raw-cuda"
    raw = args.raw or (gpu_raw if args.device == "cuda" else cpu_raw)
    raw.mkdir(parents=True, exist_ok=True)
    if not args.only_report:
        if args.device == "cuda":
            record_gpu_machine(raw)
        else:
            peers_report.record_machine(raw)
        for batch in (int(b) for b in args.batches.split(",")):  # every model at batch 1 before any at batch 8
            for name in args.models.split(","):
                if args.device == "cuda":
                    measure_model_on_gpu(name, batch, raw)
                else:
                    measure_model(
                        name,
                        batch,
                        raw,
                        torch_input=str(batch) in args.torch_batches.split(","),
                        collage_again=args.collage_again,
                        backends=args.backends,
                    )
    if args.raw is not None and args.raw.resolve() not in (FAMILIES_RAW.resolve(), cpu_raw.resolve()):
        return  # measured somewhere else: the report is written from the project's raw folders
    command = "python benchmarks/peers.py"
    if not families:
        command = " ".join([command, *(a for a in sys.argv[1:] if a not in ("--only-report", "--collage-again", "--device", "cuda"))])
    family_section = peers_report.family_section(FAMILIES_RAW, FAMILIES_COMMAND, ROOT / "benchmarks" / "results-families.png")
    report = write_report(
        cpu_raw, command, ROOT / "benchmarks" / "RESULTS.md", ROOT / "benchmarks" / "results.png", sections=(family_section,)
    )
    append_file(report, TORCH_COMPILE_REPORT)
    if gpu_raw.is_dir():
        append_gpu_section(gpu_raw, report, ROOT / "benchmarks" / "results-cuda.png")
    for written in GPU_PRECISION_REPORTS:  # written by benchmarks/precision.py --device cuda
        append_file(report, written)
    print(f"wrote {report} and its charts")


if __name__ == "__main__":
    main()
