"""ONNX Runtime's thread spinning in a mixed executable: is the mix slower than its parts?

    python plugins/onnxruntime/benchmarks/thread_settings.py [--model models/tiny_bert.onnx]

Builds three placements of one model: all on ONNX Runtime, all on TVM, and a mix that switches
between the two backends at every other operator group. Each is timed twice in a fresh process:
with every session's idle threads blocking (the plugin's setting beside other backends) and with
them spinning (ONNX Runtime's default, and the plugin's when ONNX Runtime runs the whole
executable). Prints a table; the mix should not be slower than its parts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from collage_core.kit.testing import format_table

ROOT = Path(__file__).resolve().parents[3]
MEASURE = r"""
import json, sys
import numpy as np
from collage_core.kit import Cost, Partition, RelaxGraph, enumerate_candidates, load_model, tvm_compat
from collage_core.kit.testing import (
    MeasureSettings, OpGroup, build, contribute_patterns, decode, discover_backends, get_plugin_manager,
    partition_module, search_op_level, time_callable,
)
import collage_onnxruntime.runtime as runtime

model_path, mix, spinning = sys.argv[1], sys.argv[2], sys.argv[3] == "spin"
# Every session spins, or every session blocks, whatever the plugin would choose for this placement.
plain = runtime.session_options
runtime.session_options = lambda chosen=False: plain(spinning)

model = load_model(model_path)
graph = RelaxGraph.from_function(model.mod["main"])
pm = get_plugin_manager()
backends = {name: info.backend for name, info in discover_backends(pm).items() if name in ("tvm", "onnxruntime")}
target = tvm_compat.host_cpu_target()
candidates = enumerate_candidates(graph, [p for b in backends.values() for p in contribute_patterns(pm, b, target)])
singles = [c for c in candidates if c.backend == "tvm" and c.pattern == "tvm.op"]
unit = {c.key: Cost.measured(1.0, 0.0, 1) for c in singles}
groups_parts = [Partition.from_candidate(c, unit[c.key]) for c in search_op_level(graph.graph, singles, unit)]
supported = {n for c in candidates if c.backend == "onnxruntime" for n in c.nodes}
groups = [OpGroup(p, ("onnxruntime",) if set(p.nodes) <= supported else ()) for p in groups_parts]
genome = {
    "all onnxruntime": [1 if g.choices else 0 for g in groups],
    "all tvm": [0 for g in groups],
    "mixed": [1 if g.choices and i % 4 < 2 else 0 for i, g in enumerate(groups)],
}[mix]
parts = decode(graph.graph, groups, genome)
from tvm import relax
executable = build(pm, partition_module(graph, parts), backends, target)
device = tvm_compat.device_for(target)
vm = relax.VirtualMachine(executable, device)
args = [tvm_compat.to_tensor(a, device) for a in model.random_inputs()]
settings = MeasureSettings(warmup=10, min_repeats=7, max_repeats=31, target_spread=0.02, min_repeat_ms=100.0)
cost = time_callable(lambda n: vm.time_evaluator("main", device, number=n, repeat=1)(*args).mean, settings)
print(json.dumps({"median_s": cost.median_s, "spread_s": cost.spread_s, "partitions": len(parts)}))
"""


def measure(model: Path, mix: str, spinning: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, str(model), mix, spinning], capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "tiny_bert.onnx")
    args = parser.parse_args()
    rows = []
    for mix in ("all onnxruntime", "all tvm", "mixed"):
        blocking, spinning = measure(args.model, mix, "block"), measure(args.model, mix, "spin")
        rows.append(
            [mix, str(blocking["partitions"]),
             f"{blocking['median_s'] * 1e6:.1f} ±{blocking['spread_s'] * 1e6:.1f}",
             f"{spinning['median_s'] * 1e6:.1f} ±{spinning['spread_s'] * 1e6:.1f}"]
        )
    print(f"{args.model.name}: median latency in microseconds, each in a fresh process")
    print(format_table(["placement", "partitions", "idle threads block (plugin)", "idle threads spin (ORT default)"], rows))


if __name__ == "__main__":
    main()
