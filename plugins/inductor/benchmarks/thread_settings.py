"""PyTorch's OpenMP threads beside TVM's pool: how each way of waiting changes a mixed placement.

    nice -n 10 python plugins/inductor/benchmarks/thread_settings.py [--model models/tiny_bert.onnx] [--rounds 3]

Builds two placements of one model: every matrix product on Inductor (TVM for the rest, so the
two pools take turns all through a call) and all on TVM. Each is timed in a fresh process under
the environments below (the libraries' defaults; OpenMP's idle threads spinning briefly, as Collage
starts its workers; blocking at once; TVM's blocking too; each with TVM's pool at its default size and
at two threads), in
turns, ``--rounds`` times, so that a busy machine weighs on all alike.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from collage_core.kit import WAIT_SETTINGS
from collage_core.kit.testing import format_table
from collage_core.kit.testing.benchmarks import in_fresh_process

ROOT = Path(__file__).resolve().parents[3]
THREAD_VARIABLES = (
    "OMP_WAIT_POLICY",
    "GOMP_SPINCOUNT",
    "KMP_BLOCKTIME",
    "TVM_THREAD_POOL_SPIN_COUNT",
    "TVM_NUM_THREADS",
    "OMP_NUM_THREADS",
    "COLLAGE_NUM_THREADS",
)
OMP_BLOCKS = {"OMP_WAIT_POLICY": "PASSIVE"}
BOTH_BLOCK = {**OMP_BLOCKS, "TVM_THREAD_POOL_SPIN_COUNT": "0"}
ENVIRONMENTS = {
    "defaults": {},
    "OMP spins briefly": WAIT_SETTINGS,
    "OMP blocks": OMP_BLOCKS,
    "both block": BOTH_BLOCK,
    "TVM 2: defaults": {"TVM_NUM_THREADS": "2"},
    "TVM 2: OMP spins briefly": {"TVM_NUM_THREADS": "2", **WAIT_SETTINGS},
    "TVM 2: OMP blocks": {"TVM_NUM_THREADS": "2", **OMP_BLOCKS},
    "TVM 2: both block": {"TVM_NUM_THREADS": "2", **BOTH_BLOCK},
}
MEASURE = r"""
import json, sys
from collage_core.kit import Cost, Partition
from collage_core.kit.testing.benchmarks import ModelOnBackends

model_path, placement = sys.argv[1], sys.argv[2]
placing = ModelOnBackends.load(model_path, ("tvm", "inductor"))
ops = placing.graph.graph.ops
on_inductor = {i for i, op in enumerate(ops) if op == "relax.matmul"} if placement == "matmuls on inductor" else set()
chosen = [c for c in placing.candidates if len(c.nodes) == 1
          and (c.backend == "inductor") == (min(c.nodes) in on_inductor) and (c.backend in ("inductor", "tvm"))
          and (c.backend == "inductor" or c.pattern == "tvm.op")]
parts = [Partition.from_candidate(c, Cost.measured(1.0, 0.0, 1)) for c in chosen]
assert len(parts) == len(ops), (len(parts), len(ops))
cost = placing.latency(parts)
print(json.dumps({"median_s": cost.median_s, "spread_s": cost.spread_s, "inductor": len(on_inductor)}))
"""


def measure(model: Path, placement: str, environment: dict) -> dict:
    env = {key: value for key, value in os.environ.items() if key not in THREAD_VARIABLES}
    env.update(environment)
    return in_fresh_process(MEASURE, str(model), placement, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "tiny_bert.onnx")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    placements = ("matmuls on inductor", "all tvm")
    results = {(p, name): [] for p in placements for name in ENVIRONMENTS}
    for _ in range(args.rounds):
        for placement in placements:
            for name, environment in ENVIRONMENTS.items():
                results[placement, name].append(measure(args.model, placement, environment))
    rows = [
        [placement, *(" ".join(f"{r['median_s'] * 1e6:.0f}" for r in results[placement, name]) for name in ENVIRONMENTS)]
        for placement in placements
    ]
    print(format_table(["placement", *ENVIRONMENTS], rows))
    print(f"{args.model.name}: median latency in microseconds, one per round, each in a fresh process")


if __name__ == "__main__":
    main()
