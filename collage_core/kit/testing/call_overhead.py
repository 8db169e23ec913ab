"""What a plugin's call-overhead benchmark shares: one operator, placed on a backend and built, each path timed per call.

A benchmark makes :class:`OneOperator` of its operator and shape, takes the VM of each placement it
compares (``vm("dnnl", "dnnl.softmax")``, ``vm("tvm")``), and prints :func:`timed` rows, one per path.
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace
from typing import Callable, Optional, Sequence

import attrs
import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_core.backends import discover_backends
from collage_core.build import build
from collage_core.partition import partition_module
from collage_core.plugins import get_plugin_manager
from collage_core.relax_graph import RelaxGraph
from collage_core.timing import MeasureSettings, time_callable

SETTINGS = MeasureSettings(warmup=20, min_repeats=7, max_repeats=31, target_spread=0.02, min_repeat_ms=50.0, time_bound_s=10.0)


def shape_from_arguments(description: str) -> tuple[int, ...]:
    """The ``--shape`` a benchmark is run with (default 1,64)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--shape", default="1,64", help="the tensor's shape, comma-separated (default 1,64)")
    return tuple(int(d) for d in parser.parse_args().shape.split(","))


@attrs.frozen
class OneOperator:
    """``main(x) = operator(x)`` on one float32 tensor, and what placing it on a backend needs."""

    mod: tvm.IRModule
    graph: RelaxGraph
    pm: object
    backends: dict
    target: object = attrs.field(eq=False)
    device: object = attrs.field(eq=False)

    @classmethod
    def from_operator(cls, operator: Callable, shape: Sequence[int]) -> "OneOperator":
        x = relax.Var("x", relax.TensorType(tuple(shape), "float32"))
        bb = relax.BlockBuilder()
        with bb.function("main", [x]):
            with bb.dataflow():
                output = bb.emit_output(operator(x))
            bb.emit_func_output(output)
        mod = bb.get()
        pm = get_plugin_manager()
        backends = {name: info.backend for name, info in discover_backends(pm).items()}
        target = tvm_compat.host_cpu_target()
        return cls(mod, RelaxGraph.from_function(mod["main"]), pm, backends, target, tvm_compat.device_for(target))

    def vm(self, backend: str, pattern: Optional[str] = None):
        """The built VM's ``main`` with the operator placed on ``backend`` (pattern ``<backend>.op`` unless named)."""
        part = SimpleNamespace(backend=backend, pattern=pattern or f"{backend}.op", nodes=frozenset({0}))
        executable = build(self.pm, partition_module(self.graph, [part]), self.backends, self.target)
        return relax.VirtualMachine(executable, self.device)["main"]


def per_call(function: Callable[[], object]) -> tuple[float, float]:
    """Median and interquartile range of one call of ``function``, in microseconds."""

    def run(number: int) -> float:
        started = time.perf_counter()
        for _ in range(number):
            function()
        return (time.perf_counter() - started) / number

    cost = time_callable(run, SETTINGS)
    return cost.median_s * 1e6, cost.spread_s * 1e6


def timed(rows: Sequence[tuple[str, Callable[[], object]]]) -> list[tuple[str, float, float]]:
    """Each ``(path, function)`` row timed: ``(path, median us, IQR us)``."""
    return [(name, *per_call(function)) for name, function in rows]
