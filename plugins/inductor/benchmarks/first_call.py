"""How long a fresh process takes to run a model placed whole on TorchInductor for the first time.

    python plugins/inductor/benchmarks/first_call.py [--model models/tiny_bert.onnx] [--runs 3]

Builds the model as one Inductor region, exports the library, then loads and runs it in new
processes that import only TVM and ``collage_inductor``, as Collage's measurement workers do: one
process first (which fills the caches under ``$COLLAGE_CACHE_DIR/inductor`` if they are empty; its
time is printed as ``filling the cache``), then ``--runs`` more with the caches warm. Each process
prints the seconds it took to import TVM and ``collage_inductor``, to load the library, to import torch
(which the first call would otherwise do), to make the first call (where the region's program is
compiled or loaded) and the median and mean of 200 later calls.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from collage_core.kit import RelaxGraph, load_model, tvm_compat
from collage_core.kit.testing import build, discover_backends, get_plugin_manager, partition_module
from collage_core.kit.testing.benchmarks import in_fresh_process

ROOT = Path(__file__).resolve().parents[3]
FIRST_CALL = r"""
import json, sys, time
started = time.perf_counter()
import numpy as np, tvm
from tvm import relax
import collage_inductor
imported = time.perf_counter()
vm = relax.VirtualMachine(tvm.runtime.load_module(sys.argv[1]), tvm.cpu())
inputs = [tvm.runtime.tensor(array) for array in np.load(sys.argv[2]).values()]
loaded = time.perf_counter()
import torch  # as the first call would, timed apart
torch_imported = time.perf_counter()
vm["main"](*inputs)
first = time.perf_counter()
later = []
for _ in range(200):
    called = time.perf_counter()
    vm["main"](*inputs)
    later.append(time.perf_counter() - called)
print(json.dumps({"import_s": imported - started, "load_s": loaded - imported, "torch_import_s": torch_imported - loaded,
                  "first_call_s": first - torch_imported, "later_call_ms": 1e3 * sorted(later)[len(later) // 2],
                  "later_mean_ms": 1e3 * sum(later) / len(later)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "tiny_bert.onnx")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes timed with the caches warm (default 3)")
    args = parser.parse_args()
    model = load_model(args.model)
    graph = RelaxGraph.from_function(model.mod["main"])
    pm = get_plugin_manager()
    backends = {name: info.backend for name, info in discover_backends(pm).items()}
    whole = SimpleNamespace(backend="inductor", pattern="inductor.region", nodes=frozenset(range(len(graph.graph))))
    executable = build(pm, partition_module(graph, [whole]), backends, tvm_compat.host_cpu_target())
    with tempfile.TemporaryDirectory() as folder:
        library, inputs = Path(folder) / "whole.so", Path(folder) / "inputs.npz"
        executable.export_library(str(library))
        np.savez(inputs, *model.random_inputs(seed=1))
        filling = in_fresh_process(FIRST_CALL, str(library), str(inputs))
        warm = [in_fresh_process(FIRST_CALL, str(library), str(inputs)) for _ in range(args.runs)]
    print(f"{args.model.name} whole on inductor, {len(graph.graph)} operators")
    print(f"filling the cache: first call {filling['first_call_s']:.2f} s")
    for name in ("import_s", "load_s", "torch_import_s", "first_call_s", "later_call_ms", "later_mean_ms"):
        values = [run[name] for run in warm]
        label, unit = name.rsplit("_", 1)
        print(
            f"warm cache, {label.replace('_', ' ')}: median {statistics.median(values):.3f} {unit} "
            f"({', '.join(f'{v:.3f}' for v in values)})"
        )


if __name__ == "__main__":
    main()
