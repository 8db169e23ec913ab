"""Candidates measured per minute on 1, 2 and 4 RPC servers (and here, for reference).

Each configuration starts its own tracker and servers on this machine (``collage_core.measure.rpc_cluster``), each
server pinned to a core of its own (cores are reused, modulo their count, when there are fewer cores than servers:
the table says so), and measures every candidate of the model from an empty cost database with
``collage optimize --rpc-tracker ... --calibration-rounds 0 --no-compare --no-verify``. The rate counts the
candidates' builds here too, as a run pays them.

    python benchmarks/remote_measurement.py --model models/tiny_resnet.onnx --backends tvm,dnnl --servers 1,2,4
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import collage_core
from collage_core.measure.rpc_cluster import LocalCluster
from collage_core.measure.timing import MeasureSettings

KEY = "benchmark"


def measure(model: str, backends: list[str], servers: int, workdir: Path, settings: MeasureSettings) -> tuple[int, float]:
    """(candidates measured, seconds) with ``servers`` servers (0: here, no RPC)."""
    cores = sorted(os.sched_getaffinity(0))
    options = dict(
        backends=backends,
        cost_db=workdir / f"costs-{servers}.sqlite",
        output_dir=workdir / f"out-{servers}",
        calibration_rounds=0,
        compare_backends=False,
        verify=False,
        show_progress=False,
        settings=settings,
    )
    if servers == 0:
        started = time.perf_counter()
        result = collage_core.optimize(model, **options)
        return result.measurement.measured, result.measurement.seconds or time.perf_counter() - started
    with LocalCluster() as cluster:
        cluster.add_servers(KEY, servers, cpus=[[cores[index % len(cores)]] for index in range(servers)])
        result = collage_core.optimize(model, rpc_tracker=cluster.address, rpc_key=KEY, **options)
    return result.measurement.measured, result.measurement.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/tiny_resnet.onnx")
    parser.add_argument("--backends", default="tvm,dnnl")
    parser.add_argument("--servers", default="1,2,4", help="server counts, comma-separated (0: measured here)")
    parser.add_argument("--local", action="store_true", help="also measure here, without RPC, for reference")
    parser.add_argument(
        "--min-repeat-ms",
        type=float,
        default=MeasureSettings().min_repeat_ms,
        help="how long each timed repeat lasts (longer: timing outweighs the builds here, and the servers' share shows)",
    )
    args = parser.parse_args()
    counts = ([0] if args.local else []) + [int(count) for count in args.servers.split(",")]
    cores = len(os.sched_getaffinity(0))
    settings = MeasureSettings(min_repeat_ms=args.min_repeat_ms)
    print(f"{args.model}, backends {args.backends}; {platform.machine()}, {cores} cores; repeats of {args.min_repeat_ms:g} ms")
    print("| servers | candidates | seconds | candidates per minute | cores shared |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as workdir:
        for count in counts:
            measured, seconds = measure(args.model, args.backends.split(","), count, Path(workdir), settings)
            shared = "n/a" if count == 0 else ("yes" if count > cores else "no")
            print(f"| {count or 'here'} | {measured} | {seconds:.1f} | {60 * measured / seconds:.1f} | {shared} |", flush=True)


if __name__ == "__main__":
    main()
