"""How fast the op-level search is on synthetic graphs shaped like ResNet-50 and BERT.

The graphs mimic what TVM Relax imports: every convolution and linear layer has its own weight
transform (an operator with no operator inputs), batch norm is spelled out elementwise, and
attention splits into Q/K/V branches. Candidates are singletons on a generic backend, vendor
singletons for the heavy operators, fused chains of 2-4 operators on one or two backends, and
heavy operators that share an input batched together.
Costs come from a synthetic latency model, not from measurements.

Run: python benchmarks/op_level_search_speed.py
"""

from __future__ import annotations

import hashlib
import time

import attrs

from collage_core.records import Candidate, Cost
from collage_core.search.graph import OpGraph
from collage_core.search.op_level import search_op_level

HEAVY_OPS = {"nn.conv2d": "cudnn", "matmul": "cublas"}
FUSING_BACKENDS = ("tensorrt", "cutlass")
BASE_SECONDS = {"nn.conv2d": 100e-6, "matmul": 80e-6, "nn.softmax": 12e-6, "nn.layer_norm": 10e-6}
ELEMENTWISE_SECONDS = 5e-6
LAUNCH_SECONDS = 4e-6


@attrs.define
class GraphBuilder:
    ops: list[str] = attrs.Factory(list)
    preds: list[set[int]] = attrs.Factory(list)

    def add(self, op: str, *inputs: int | None) -> int:
        self.ops.append(op)
        self.preds.append({i for i in inputs if i is not None})
        return len(self.ops) - 1

    def build(self) -> OpGraph:
        return OpGraph(ops=self.ops, preds=self.preds)


def conv_unit(b: GraphBuilder, x: int | None, relu: bool = True) -> int:
    """conv2d with a transformed weight, bias, and batch norm as Relax spells it out."""
    out = b.add("add", b.add("nn.conv2d", x, b.add("layout_transform")))
    out = b.add("add", b.add("multiply", b.add("multiply", b.add("subtract", out))))
    return b.add("nn.relu", out) if relu else out


def resnet50_like() -> OpGraph:
    b = GraphBuilder()
    x = b.add("nn.max_pool2d", conv_unit(b, None))
    for stage_blocks in (3, 4, 6, 3):
        for block in range(stage_blocks):
            main = conv_unit(b, conv_unit(b, conv_unit(b, x)), relu=False)
            shortcut = conv_unit(b, x, relu=False) if block == 0 else x
            x = b.add("nn.relu", b.add("add", main, shortcut))
    b.add("add", b.add("matmul", b.add("reshape", b.add("mean", x)), b.add("permute_dims")))
    return b.build()


def linear(b: GraphBuilder, x: int) -> int:
    return b.add("add", b.add("matmul", x, b.add("permute_dims")))


def bert_like(layers: int) -> OpGraph:
    b = GraphBuilder()
    x = b.add("nn.layer_norm", b.add("add", b.add("take"), b.add("take")))
    for _ in range(layers):
        q, k, v = (b.add("permute_dims", b.add("reshape", linear(b, x))) for _ in "qkv")
        scores = b.add("nn.softmax", b.add("add", b.add("divide", b.add("matmul", q, b.add("permute_dims", k)))))
        context = b.add("reshape", b.add("permute_dims", b.add("matmul", scores, v)))
        x = b.add("nn.layer_norm", b.add("add", linear(b, context), x))
        hidden = b.add("nn.gelu", linear(b, x))
        x = b.add("nn.layer_norm", b.add("add", linear(b, hidden), x))
    return b.build()


def paths_from(graph: OpGraph, start: int, length: int):
    if length == 1:
        yield (start,)
        return
    for succ in sorted(graph.succs[start]):
        for rest in paths_from(graph, succ, length - 1):
            yield (start,) + rest


def chain_candidates(graph: OpGraph) -> list[Candidate]:
    candidates = []
    for node, op in enumerate(graph.ops):
        candidates.append(candidate("tvm", op, (node,)))
        if op in HEAVY_OPS:
            candidates.append(candidate(HEAVY_OPS[op], op, (node,)))
        for length in (2, 3, 4):
            for path in paths_from(graph, node, length):
                if not graph.is_convex(frozenset(path)):
                    continue
                heavy = any(graph.ops[n] in HEAVY_OPS for n in path)
                for backend in FUSING_BACKENDS if heavy else ("tvm",):
                    candidates.append(candidate(backend, "_".join(graph.ops[n] for n in path), path))
    return candidates


def horizontal_candidates(graph: OpGraph) -> list[Candidate]:
    """Heavy operators that read the same input, batched into one kernel (Q/K/V projections)."""
    candidates = []
    for succs in graph.succs:
        for op in HEAVY_OPS:
            siblings = frozenset(s for s in succs if graph.ops[s] == op)
            if len(siblings) > 1 and graph.is_convex(siblings):
                candidates.append(candidate("cutlass", f"horizontal_{op}", siblings))
    return candidates


def candidate(backend: str, what: str, nodes) -> Candidate:
    return Candidate(backend, f"{backend}.{what}", frozenset(nodes), f"{backend}:{sorted(nodes)}")


def synthetic_latency(graph: OpGraph, option: Candidate) -> Cost:
    """A launch per candidate; fused elementwise operators ride along almost for free."""
    digest = int(hashlib.sha256(option.key.encode()).hexdigest(), 16)
    if len(option.nodes) > 1 and digest % 20 == 0:
        return Cost.invalid("synthetic build failure")
    speed = 0.6 + (digest % 800) / 1000
    fused_discount = 0.2 if len(option.nodes) > 1 else 1.0
    work = sum(BASE_SECONDS.get(graph.ops[n], ELEMENTWISE_SECONDS * fused_discount) for n in option.nodes)
    return Cost.measured(LAUNCH_SECONDS + speed * work, 0.0, 1)


def main() -> None:
    models = {"ResNet-50-like": resnet50_like(), "BERT-base-like": bert_like(12), "BERT-large-like": bert_like(24)}
    print(f"{'model':<16} {'nodes':>6} {'candidates':>10} {'states':>8} {'seconds':>8}")
    for name, graph in models.items():
        candidates = chain_candidates(graph) + horizontal_candidates(graph)
        costs = {c.key: synthetic_latency(graph, c) for c in candidates}
        expanded = []
        start = time.perf_counter()
        placement = search_op_level(graph, candidates, costs, on_progress=expanded.append)
        seconds = time.perf_counter() - start
        print(f"{name:<16} {len(graph):>6} {len(candidates):>10} {expanded[-1]:>8} {seconds:>8.2f}   ({len(placement)} parts)")


if __name__ == "__main__":
    main()
