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
from pathlib import Path

from collage_core.kit.testing import format_table
from collage_core.kit.testing.benchmarks import in_fresh_process

ROOT = Path(__file__).resolve().parents[3]
MEASURE = r"""
import json, sys
from collage_core.kit import Cost, Partition
from collage_core.kit.testing import OpGroup, decode, search_op_level
from collage_core.kit.testing.benchmarks import ModelOnBackends
import collage_onnxruntime.runtime as runtime

model_path, mix, spinning = sys.argv[1], sys.argv[2], sys.argv[3] == "spin"
# Every session spins, or every session blocks, whatever the plugin would choose for this placement.
plain = runtime.session_options
runtime.session_options = lambda chosen=False: plain(spinning)

placing = ModelOnBackends.load(model_path, ("tvm", "onnxruntime"))
graph, candidates = placing.graph, placing.candidates
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
cost = placing.latency(parts)
print(json.dumps({"median_s": cost.median_s, "spread_s": cost.spread_s, "partitions": len(parts)}))
"""


def measure(model: Path, mix: str, spinning: str) -> dict:
    return in_fresh_process(MEASURE, str(model), mix, spinning)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "tiny_bert.onnx")
    args = parser.parse_args()
    rows = []
    for mix in ("all onnxruntime", "all tvm", "mixed"):
        blocking, spinning = measure(args.model, mix, "block"), measure(args.model, mix, "spin")
        rows.append(
            [
                mix,
                str(blocking["partitions"]),
                f"{blocking['median_s'] * 1e6:.1f} ±{blocking['spread_s'] * 1e6:.1f}",
                f"{spinning['median_s'] * 1e6:.1f} ±{spinning['spread_s'] * 1e6:.1f}",
            ]
        )
    print(f"{args.model.name}: median latency in microseconds, each in a fresh process")
    print(format_table(["placement", "partitions", "idle threads block (plugin)", "idle threads spin (ORT default)"], rows))


if __name__ == "__main__":
    main()
