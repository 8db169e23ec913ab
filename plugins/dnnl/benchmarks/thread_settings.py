"""oneDNN's OpenMP threads in a mixed executable: is the mix slower than its parts?

    python plugins/dnnl/benchmarks/thread_settings.py [--model models/tiny_resnet.onnx]

Builds three placements of one model: oneDNN wherever a DNNL pattern matches (TVM for the rest),
all on TVM, and a mix that gives only every other DNNL-able group to oneDNN. Each is timed in a
fresh process under three OpenMP wait policies: libgomp's own default (spin a while, then
sleep; what the plugin leaves in place), PASSIVE (idle threads sleep at once) and ACTIVE (they
spin). Prints a table; with the plugin's setting the mix should lie between its parts.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from collage_core.kit.testing import format_table
from collage_core.kit.testing.benchmarks import in_fresh_process

ROOT = Path(__file__).resolve().parents[3]
POLICIES = ("libgomp default", "PASSIVE", "ACTIVE")
MEASURE = r"""
import json, sys
from collage_core.kit import Cost, Partition
from collage_core.kit.testing import search_op_level
from collage_core.kit.testing.benchmarks import ModelOnBackends

model_path, mix = sys.argv[1], sys.argv[2]
placing = ModelOnBackends.load(model_path, ("tvm", "dnnl"))
graph, candidates = placing.graph, placing.candidates
singles = [c for c in candidates if c.pattern == "tvm.op"]
dnnl = sorted((c for c in candidates if c.backend == "dnnl"), key=lambda c: min(c.nodes))
anchors = sorted({min(c.nodes) for c in dnnl})
chosen = {"dnnl where it can": dnnl, "all tvm": [], "mixed": [c for c in dnnl if anchors.index(min(c.nodes)) % 2 == 0]}[mix]
# Unit costs that make the search take as many chosen DNNL groups as it can, and TVM ops for the rest.
costs = {c.key: Cost.measured(10.0 * len(c.nodes), 0.0, 1) for c in singles}
costs.update({c.key: Cost.measured(1.0, 0.0, 1) for c in chosen})
parts = [Partition.from_candidate(c, costs[c.key]) for c in search_op_level(graph.graph, singles + chosen, costs)]
cost = placing.latency(parts)
print(json.dumps({"median_s": cost.median_s, "spread_s": cost.spread_s, "dnnl": sum(p.backend == "dnnl" for p in parts), "partitions": len(parts)}))
"""


def measure(model: Path, mix: str, policy: str) -> dict:
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if policy != "libgomp default":
        env["OMP_WAIT_POLICY"] = policy
    return in_fresh_process(MEASURE, str(model), mix, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "tiny_resnet.onnx")
    args = parser.parse_args()
    rows = []
    for mix in ("dnnl where it can", "all tvm", "mixed"):
        results = [measure(args.model, mix, policy) for policy in POLICIES]
        rows.append(
            [mix, f"{results[0]['dnnl']} / {results[0]['partitions']}"]
            + [f"{r['median_s'] * 1e6:.1f} ±{r['spread_s'] * 1e6:.1f}" for r in results]
        )
        print(format_table(["placement", "dnnl / all partitions", *POLICIES], rows), flush=True)
    print(f"{args.model.name}: median latency in microseconds, each in a fresh process")


if __name__ == "__main__":
    main()
