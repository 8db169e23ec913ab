"""A placement's latency after a pause, under each way of letting idle threads wait, side by side in one run.

Collage's contest times each library warm, back to back, and after a pause (docs/contest.md). On a 2-core VM a
placement of oneDNN and TVM partitions ran about 0.6 ms warm and, after 1.2 s idle, sometimes 1.4 ms and sometimes
12-19 ms. This replays a placement file in a fresh process per setting (OpenMP reads its variables as it loads),
runs it back to back, then once after each of several pauses, and prints one table:

    python benchmarks/after_pause.py MODEL.onnx PLACEMENT.json [--pauses 12] [--pause-s 1.2]
        [--setting "GOMP_SPINCOUNT=30000" --setting "OMP_WAIT_POLICY=passive" ...]

Each setting is a space-separated list of environment variables (the default list: Collage's own spin count,
OpenMP on one thread, OpenMP blocking at once, OpenMP never sleeping).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collage_core.outputs.report import format_table  # noqa: E402

DEFAULT_SETTINGS = ("GOMP_SPINCOUNT=30000", "GOMP_SPINCOUNT=30000 OMP_NUM_THREADS=1", "OMP_WAIT_POLICY=passive", "GOMP_SPINCOUNT=infinite")
WARM_RUNS = 50


def timed(model: str, placement: str, pauses: int, pause_s: float) -> dict:
    """In this process: the placement replayed, then its warm runs and its runs after each pause, in ms."""
    import collage_core

    with tempfile.TemporaryDirectory() as folder:
        result = collage_core.optimize(model, placement=placement, output_dir=folder, show_progress=False)
        inputs = result.model.random_inputs()
        for _ in range(10):
            result.run(*inputs)

        def once() -> float:
            start = time.perf_counter()
            result.run(*inputs)
            return (time.perf_counter() - start) * 1e3

        warm = [once() for _ in range(WARM_RUNS)]
        after = []
        for _ in range(pauses):
            time.sleep(pause_s)
            after.append(once())
    return {"warm": warm, "after_pause": after}


def row(setting: str, times: dict) -> list[str]:
    after = times["after_pause"]
    return [setting, f"{np.median(times['warm']):.3f} ms", f"{np.median(after):.3f} ms", f"{min(after):.2f}-{max(after):.2f} ms"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("placement")
    parser.add_argument("--pauses", type=int, default=12)
    parser.add_argument("--pause-s", type=float, default=1.2)
    parser.add_argument("--setting", action="append", help="environment variables of one process, space-separated")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(timed(args.model, args.placement, args.pauses, args.pause_s)))
        return
    rows = []
    for setting in args.setting or DEFAULT_SETTINGS:
        env = {key: value for key, value in os.environ.items() if key not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
        env.update(pair.split("=", 1) for pair in setting.split())
        command = [
            sys.executable,
            __file__,
            args.model,
            args.placement,
            "--pauses",
            str(args.pauses),
            "--pause-s",
            str(args.pause_s),
            "--child",
        ]
        print(f"timing {setting} ...", file=sys.stderr, flush=True)
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        rows.append(row(setting, json.loads(done.stdout.strip().splitlines()[-1])))
    print(f"{Path(args.placement)} over {Path(args.model).name}, {args.pauses} runs after {args.pause_s} s idle each")
    print(format_table(["idle threads", "warm median", "after a pause, median", "after a pause, range"], rows))


if __name__ == "__main__":
    main()
