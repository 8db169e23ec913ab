"""Where a Collage library's time goes on the GPU, kernel by kernel: which library each kernel comes from
(cuBLAS, cuDNN, TVM, Triton) and how long it runs per call, read by CUPTI through ``torch.profiler``.

    python benchmarks/kernel_profile.py LIBRARY.so MODEL.onnx [--runs 20] [--top 30] [--json OUT]

``LIBRARY.so`` is what ``collage optimize --target cuda`` wrote (``collage-out/<model>/<model>.so``), and
``MODEL.onnx`` the file it was made from, for its inputs' shapes and types (random values; integer inputs in
[0, 100), token ids any vocabulary holds). The library is warmed up, then called ``--runs`` times under the
profiler. The table gives each kernel's calls and microseconds per library call, grouped by where it comes
from, and the sum of kernel time beside the wall time per call: the gap is launches and idle GPU. Kernels
replayed from a CUDA graph are counted as any other. Needs a CUDA GPU, PyTorch with CUDA and TVM's runtime.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

# Where a kernel comes from, by its name (first match wins). Triton's kernels (Inductor) are triton_*; cuDNN's
# engines cudnn*, *fmha*/flash/sdpa (attention) and *fprop* (convolutions); cuBLAS on Hopper nvjet_* and
# sm90_xmma_gemm_*; TVM's are plain identifiers ending in _kernel (or _kernel0, ...), named after the operators
# they fuse (fused_conv2d_add_kernel), which name no library.
ORIGINS = (
    ("triton", re.compile(r"^triton_")),
    ("cudnn", re.compile(r"cudnn|fmha|flash|sdpa|fprop|dgrad|wgrad|implicit_gemm", re.I)),
    ("cublas", re.compile(r"nvjet|gemm|cublas|xmma|cutlass|splitk", re.I)),
    ("tvm", re.compile(r"^[A-Za-z_][A-Za-z0-9_]*_kernel\d*$")),
)


def origin_of(kernel: str) -> str:
    """The library a kernel's name says it comes from (``other`` when none does)."""
    return next((name for name, pattern in ORIGINS if pattern.search(kernel)), "other")


def _inputs(model: Path) -> list[np.ndarray]:
    import onnx

    proto = onnx.load(str(model), load_external_data=False)
    constants = {init.name for init in proto.graph.initializer}
    rng = np.random.default_rng(0)
    arrays = []
    for value in proto.graph.input:
        if value.name in constants:
            continue
        tensor = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 1 for d in tensor.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if np.issubdtype(dtype, np.integer):
            arrays.append(rng.integers(0, 100, size=shape).astype(dtype))
        else:
            arrays.append(rng.standard_normal(shape).astype(dtype))
    return arrays


def profile(library: Path, model: Path, runs: int) -> dict:
    """Each kernel's origin, calls and microseconds per library call, with the wall time per call."""
    import torch
    import tvm
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from collage_core.build.deploy import load_vm

    device = tvm.cuda(0)
    vm = load_vm(library, device=device)
    arguments = [tvm.runtime.tensor(array, device) for array in _inputs(model)]
    main = vm["main"]
    for _ in range(5):
        main(*arguments)
    device.sync()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as profiler:
        started = time.perf_counter()
        for _ in range(runs):
            main(*arguments)
        device.sync()
        wall_s = (time.perf_counter() - started) / runs
    kernels: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for event in profiler.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time_total > 0:
            kernels[event.name][0] += 1
            kernels[event.name][1] += event.device_time_total  # microseconds
    rows = [
        {"kernel": name, "origin": origin_of(name), "calls": calls / runs, "us": total / runs}
        for name, (calls, total) in sorted(kernels.items(), key=lambda item: -item[1][1])
    ]
    return {"library": str(library), "runs": runs, "wall_us": wall_s * 1e6, "kernels": rows, "gpu": torch.cuda.get_device_name(0)}


def table(result: dict, top: int) -> str:
    """The profile as text: by origin, then the ``top`` kernels."""
    rows = result["kernels"]
    kernel_us = sum(row["us"] for row in rows)
    lines = [
        f"{result['library']} on {result['gpu']}: {result['wall_us']:.1f} us per call (wall), {kernel_us:.1f} us in kernels "
        f"({kernel_us / result['wall_us']:.0%}), {sum(row['calls'] for row in rows):.0f} kernels per call",
        "",
        "| origin | kernels per call | us per call | share of kernel time |",
        "|---|---|---|---|",
    ]
    by_origin = collections.defaultdict(lambda: [0.0, 0.0])
    for row in rows:
        by_origin[row["origin"]][0] += row["calls"]
        by_origin[row["origin"]][1] += row["us"]
    for origin, (calls, us) in sorted(by_origin.items(), key=lambda item: -item[1][1]):
        lines.append(f"| {origin} | {calls:.0f} | {us:.1f} | {us / kernel_us:.0%} |")
    lines += ["", "| kernel | origin | calls per call | us per call | us per launch |", "|---|---|---|---|---|"]
    for row in rows[:top]:
        name = row["kernel"] if len(row["kernel"]) <= 90 else row["kernel"][:87] + "..."
        lines.append(f"| `{name}` | {row['origin']} | {row['calls']:.0f} | {row['us']:.1f} | {row['us'] / row['calls']:.2f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("library", type=Path)
    parser.add_argument("model", type=Path)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None, help="write every kernel's row here too")
    args = parser.parse_args()
    result = profile(args.library, args.model, args.runs)
    print(table(result, args.top))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
