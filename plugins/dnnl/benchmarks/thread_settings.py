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
import json
import os
import subprocess
import sys
from pathlib import Path

from collage_core.kit.testing import format_table

ROOT = Path(__file__).resolve().parents[3]
POLICIES = ("libgomp default", "PASSIVE", "ACTIVE")
MEASURE = r"""
import json, sys
from collage_core.kit import Cost, Partition, RelaxGraph, enumerate_candidates, load_model, tvm_compat
from collage_core.kit.testing import (
    MeasureSettings, build, contribute_patterns, discover_backends, get_plugin_manager, partition_module,
    search_op_level, time_callable,
)
from tvm import relax

model_path, mix = sys.argv[1], sys.argv[2]
model = load_model(model_path)
graph = RelaxGraph.from_function(model.mod["main"])
pm = get_plugin_manager()
backends = {name: info.backend for name, info in discover_backends(pm).items() if name in ("tvm", "dnnl")}
target = tvm_compat.host_cpu_target()
candidates = enumerate_candidates(graph, [p for b in backends.values() for p in contribute_patterns(pm, b, target)])
singles = [c for c in candidates if c.pattern == "tvm.op"]
dnnl = sorted((c for c in candidates if c.backend == "dnnl"), key=lambda c: min(c.nodes))
anchors = sorted({min(c.nodes) for c in dnnl})
chosen = {"dnnl where it can": dnnl, "all tvm": [], "mixed": [c for c in dnnl if anchors.index(min(c.nodes)) % 2 == 0]}[mix]
# Unit costs that make the search take as many chosen DNNL groups as it can, and TVM ops for the rest.
costs = {c.key: Cost.measured(10.0 * len(c.nodes), 0.0, 1) for c in singles}
costs.update({c.key: Cost.measured(1.0, 0.0, 1) for c in chosen})
parts = [Partition.from_candidate(c, costs[c.key]) for c in search_op_level(graph.graph, singles + chosen, costs)]
executable = build(pm, partition_module(graph, parts), backends, target)
device = tvm_compat.device_for(target)
vm = relax.VirtualMachine(executable, device)
args = [tvm_compat.to_tensor(a, device) for a in model.random_inputs()]
settings = MeasureSettings(warmup=10, min_repeats=7, max_repeats=31, target_spread=0.02, min_repeat_ms=100.0)
cost = time_callable(lambda n: vm.time_evaluator("main", device, number=n, repeat=1)(*args).mean, settings)
print(json.dumps({"median_s": cost.median_s, "spread_s": cost.spread_s, "dnnl": sum(p.backend == "dnnl" for p in parts), "partitions": len(parts)}))
"""


def measure(model: Path, mix: str, policy: str) -> dict:
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if policy != "libgomp default":
        env["OMP_WAIT_POLICY"] = policy
    result = subprocess.run([sys.executable, "-c", MEASURE, str(model), mix], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{mix} / {policy}: {result.stderr.strip().splitlines()[-1]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


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
