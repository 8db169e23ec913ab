"""What plugins' benchmarks share: the per-call overhead of one operator, and the latency of a model's placements.

A call-overhead benchmark makes :class:`OneOperator` of its operator and shape, takes the VM of each
placement it compares (``vm("dnnl", "dnnl.softmax")``, ``vm("tvm")``), and prints :func:`timed` rows,
one per path. A thread-settings benchmark times placements of a model (:class:`ModelOnBackends`,
``latency(parts)``), each in a fresh process (:func:`in_fresh_process`) under the settings it compares.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Callable, Optional, Sequence

import attrs
import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_core.backends import contribute_patterns, discover_backends
from collage_core.build.executable import build
from collage_core.build.partition import partition_module
from collage_core.candidates.enumeration import enumerate_candidates
from collage_core.measure.timing import MeasureSettings, time_callable
from collage_core.model.model_import import load_model
from collage_core.model.relax_graph import RelaxGraph
from collage_core.plugins import get_plugin_manager
from collage_core.records import Cost

SETTINGS = MeasureSettings(warmup=20, min_repeats=7, max_repeats=31, target_spread=0.02, min_repeat_ms=50.0, time_bound_s=10.0)
PLACEMENT_SETTINGS = MeasureSettings(warmup=10, min_repeats=7, max_repeats=31, target_spread=0.02, min_repeat_ms=100.0)


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


@attrs.frozen
class ModelOnBackends:
    """A model, the installed backends of ``names``, and their candidates over it on this CPU."""

    model: object
    graph: RelaxGraph
    pm: object
    backends: dict
    candidates: list
    target: object = attrs.field(eq=False)

    @classmethod
    def load(cls, path, names: Sequence[str]) -> "ModelOnBackends":
        model = load_model(path)
        graph = RelaxGraph.from_function(model.mod["main"])
        pm = get_plugin_manager()
        backends = {name: info.backend for name, info in discover_backends(pm).items() if name in names}
        target = tvm_compat.host_cpu_target()
        patterns = [pattern for backend in backends.values() for pattern in contribute_patterns(pm, backend, target)]
        return cls(model, graph, pm, backends, enumerate_candidates(graph, patterns), target)

    def latency(self, parts) -> Cost:
        """The placement of ``parts`` built and timed end to end on the model's random inputs."""
        device = tvm_compat.device_for(self.target)
        vm = relax.VirtualMachine(build(self.pm, partition_module(self.graph, parts), self.backends, self.target), device)
        args = [tvm_compat.to_tensor(array, device) for array in self.model.random_inputs()]
        return time_callable(lambda n: vm.time_evaluator("main", device, number=n, repeat=1)(*args).mean, PLACEMENT_SETTINGS)


def in_fresh_process(code: str, *args: str, env: Optional[dict] = None) -> dict:
    """Run ``code`` in a new Python process with ``args`` as ``sys.argv[1:]`` (and ``env``, if given): the JSON
    object its last line of output prints. A process that fails stops the benchmark with its last error line."""
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{' / '.join(args[1:])}: {result.stderr.strip().splitlines()[-1]}")
    return json.loads(result.stdout.strip().splitlines()[-1])
