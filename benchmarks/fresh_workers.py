"""Forked workers against freshly started ones: start-up time, and whether they time alike.

Collage measures every build in a fresh process. Workers are forked from a zygote that imported
TVM and the plugins once (see ``collage_core.measure.zygote``); ``COLLAGE_FRESH_WORKERS=exec`` starts each
with its own interpreter instead. This benchmark optimizes a model (with ``--output``, so each
baseline's placement is saved), builds the placement and every baseline into a library, then,
for each library, loads it in forked and in exec-started workers and times them all in turns
(the contest's protocol: bursts of runs, rotating, every worker waiting while another runs).
It prints one table: per library, the median latency seen by each kind of worker and their
ratio, and the time to start each kind of worker.

Run: python benchmarks/fresh_workers.py [--model models/tiny_resnet.onnx] [--workers 2] [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

import collage_core
from collage_core import tvm_compat
from collage_core.measure.worker_client import MeasurementWorker

ROOT = Path(__file__).resolve().parents[1]


def build_libraries(model: Path, backends, out: Path) -> tuple[dict[str, Path], list]:
    """The searched placement and each saved baseline, built into libraries under ``out``, and the model's inputs."""
    result = collage_core.optimize(str(model), backends=backends, output_dir=out / "search", show_progress=True)
    libraries = {"placement": out / "search" / f"{result.model.name}.so"}
    for placement in sorted((out / "search" / "baselines").glob("*.json")):
        try:
            built = collage_core.optimize(
                str(model), placement=placement, compare_backends=False, verify=False, output_dir=out / placement.stem, show_progress=False
            )
        except collage_core.CollageError as error:
            print(f"{placement.stem}: not built ({error})")
            continue
        libraries[placement.stem] = out / placement.stem / f"{built.model.name}.so"
    return libraries, result.model.random_inputs()


def start(kind: str) -> tuple[MeasurementWorker, float]:
    """A started worker, forked (``fork``) or with its own interpreter (``exec``), and its start-up seconds."""
    worker = MeasurementWorker([], [], env=dict(os.environ) if kind == "exec" else None)
    started = time.perf_counter()
    worker._start()
    return worker, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "tiny_resnet.onnx")
    parser.add_argument("--backends", default=None, help="comma-separated (default: every available one)")
    parser.add_argument("--workers", type=int, default=2, help="workers of each kind per library")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--burst-s", type=float, default=0.3)
    args = parser.parse_args()
    backends = args.backends.split(",") if args.backends else None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        libraries, model_inputs = build_libraries(args.model, backends, out)
        inputs = out / "inputs.npz"
        np.savez(inputs, *model_inputs)
        target = tvm_compat.target_to_json(tvm_compat.host_cpu_target())
        workers, start_s, once_s = {}, {"fork": [], "exec": []}, {}
        try:
            for name, library in libraries.items():
                for kind in ("fork", "exec"):
                    for copy in range(args.workers):
                        worker, seconds = start(kind)
                        start_s[kind].append(seconds)
                        request = {"op": "load_library", "library": str(library), "inputs": str(inputs), "target": target}
                        once_s[name, kind, copy] = max(worker.request(request, 600)["once_s"], 1e-6)
                        workers[name, kind, copy] = worker
            samples = {key: [] for key in workers}
            keys = list(workers)
            for round_index in range(args.rounds):
                shift = round_index % len(keys)
                for key in keys[shift:] + keys[:shift]:
                    count = max(1, int(args.burst_s / once_s[key]))
                    samples[key] += workers[key].request({"op": "time_turn", "count": count}, 600)["samples_s"]
        finally:
            for worker in workers.values():
                worker.close()
    print()
    print(f"{args.model.name}: {args.workers} workers of each kind per library, {args.rounds} rounds in turns")
    print(f"{'library':<32} {'forked ms':>10} {'exec ms':>10} {'forked/exec':>12}")
    ratios = []
    for name in libraries:
        forked = np.median([s for c in range(args.workers) for s in samples[name, "fork", c]]) * 1e3
        fresh = np.median([s for c in range(args.workers) for s in samples[name, "exec", c]]) * 1e3
        ratios.append(forked / fresh)
        print(f"{name:<32} {forked:>10.3f} {fresh:>10.3f} {forked / fresh:>12.3f}")
    print(f"{'geomean':<32} {'':>10} {'':>10} {float(np.exp(np.mean(np.log(ratios)))):>12.3f}")
    print(
        f"worker start-up, median: forked {np.median(start_s['fork']) * 1e3:.1f} ms "
        f"(the first starts the zygote: {start_s['fork'][0]:.2f} s), exec {np.median(start_s['exec']):.2f} s"
    )


if __name__ == "__main__":
    main()
