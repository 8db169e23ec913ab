"""Compiling ahead of time every CUTLASS kernel a model's candidates could run, on any machine with nvcc.

    python -m collage_cutlass.prebuild model.onnx [more.onnx ...] [--precision fp16] [--tiles N] [--dry-run]

A CUTLASS kernel takes one to three minutes of nvcc; a model at 16 bits needs a handful of kinds
(operand types, layouts, epilogue), each compiled in every configuration tuning tries. This compiles
them all, in parallel with progress, into ``$COLLAGE_CACHE_DIR/cutlass/`` on a machine without a GPU
(nvcc and CUTLASS's headers are all it needs). The cache is keyed by what decides the binary, not by
where things are installed, so copying the cache directory to the GPU machine (same nvcc, CUTLASS and
TVM FFI versions) leaves tuning there only the timing to do. Kinds do not depend on sizes: a small
model of the same architecture names the kernels of its large one.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from collage_core.kit import Group, Refused, RelaxGraph, at_precision, enumerate_candidates, load_model
from collage_cutlass import library, patterns, specs, tuning


def kinds_in(function, tf32: bool = False) -> set:
    """The kernel kinds of every CUTLASS candidate of a Relax function (candidates CUTLASS refuses add none)."""
    graph = RelaxGraph.from_function(function)
    kinds = set()
    for candidate in enumerate_candidates(graph, patterns.patterns(tf32=tf32)):
        try:
            group = Group.from_function(graph.standalone_module(candidate.nodes)["main"])
            kinds.add(specs.recognize(group, tf32=tf32).kind)
        except Refused:
            continue
    return kinds


def kernels_for(kinds) -> list:
    """Each kind (GEMM or convolution) in each configuration tuning tries for it (``$COLLAGE_CUTLASS_TILES`` bounds them)."""
    return [kind.kernel(config) for kind in sorted(kinds, key=lambda kind: kind.describe()) for config in tuning.configs(kind)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collage_cutlass.prebuild", description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="ONNX files")
    parser.add_argument("--precision", default="fp16", choices=["fp16", "bf16", "tf32"])
    parser.add_argument("--tiles", type=int, default=None, help="try only the first N configurations (as COLLAGE_CUTLASS_TILES)")
    parser.add_argument("--dry-run", action="store_true", help="list the kernels, compile nothing")
    args = parser.parse_args(argv)
    if args.tiles is not None:
        os.environ["COLLAGE_CUTLASS_TILES"] = str(args.tiles)
    kinds: set = set()
    for model in args.models:
        try:
            found = kinds_in(at_precision(load_model(model), args.precision).mod["main"], tf32=args.precision == "tf32")
        except Exception as failed:  # noqa: BLE001 - one line naming the model, not a traceback
            print(f"error: {model}: {failed}", file=sys.stderr)
            return 2
        print(f"{model}: {len(found)} kernel kinds at {args.precision}: " + "; ".join(sorted(k.describe() for k in found)))
        kinds |= found
    wanted = kernels_for(kinds)
    return compile_kernels(
        wanted, f"{len(wanted)} kernels ({len(kinds)} kinds, each in up to {len(tuning.configs())} configurations)", args.dry_run
    )


def compile_kernels(wanted, heading: str, dry_run: bool = False) -> int:
    """Compile those of ``wanted`` not built yet, in parallel with progress, saying ``heading`` and how many
    are missing first; the exit code: 0 done (or a dry run), 1 some did not compile, 2 CUTLASS unavailable."""
    try:
        missing = [kernel for kernel in wanted if not library.native_library(kernel).path().exists()]
    except library.CutlassUnavailable as unavailable:
        print(heading)
        print(f"error: {unavailable}", file=sys.stderr)
        return 0 if dry_run else 2
    print(f"{heading}, {len(missing)} to compile into {library.cache_dir()}, {library.compile_jobs(max(1, len(missing)))} at a time")
    if dry_run or not missing:
        return 0
    started = time.monotonic()
    try:
        built = library.build_all(missing)
    except library.CutlassUnavailable as unavailable:
        print(f"error: {unavailable}", file=sys.stderr)
        return 2
    failed = {kernel: why for kernel, why in built.items() if isinstance(why, Exception)}
    for kernel, why in failed.items():
        print(f"did not compile: {kernel.config.name} ({kernel.kind.describe()}): {why}", file=sys.stderr)
    print(f"compiled {len(missing) - len(failed)} of {len(missing)} in {time.monotonic() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
