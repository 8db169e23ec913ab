"""What CUTLASS's tuning chose on this machine and what it bought: one row per tuned problem, from the caches.

    python benchmarks/cutlass_tuning.py     # after `collage optimize --target cuda --backends ...,cutlass` runs

For each problem the CUTLASS plugin tuned (``$COLLAGE_CACHE_DIR/cutlass/tuning.json``), one table for
matrix products and one for convolutions: its kind and size, each configuration's median milliseconds
on the GPU, the chosen one, and the gain over the first configuration (what an untuned plugin would
run); then how many kernels were compiled and the nvcc seconds they took (``compile_seconds.json``;
compiles run in parallel, so the wall time is shorter).
"""

from __future__ import annotations

import statistics

from collage_cutlass import library, tuning
from collage_cutlass.conv_kernels import CONV_TILE_CONFIGS
from collage_cutlass.kernels import TILE_CONFIGS


def _size(entry) -> str:
    if entry["kind"].startswith("conv2d"):
        n, h, w, c, k, r, s = entry["problem"]
        return f"{n}x{h}x{w}x{c} -> {k}, {r}x{s}"
    m, n, k, batch, outer = entry["problem"]
    return f"{m}x{n}x{k}" + (f" x{batch}" if batch > 1 else "") + (f" x{outer} loops" if outer > 1 else "")


def rows(convolutions: bool = False) -> list[list[str]]:
    configs = CONV_TILE_CONFIGS if convolutions else TILE_CONFIGS
    found = []
    for entry in sorted(tuning.tuned(), key=lambda e: (e["kind"], e["problem"])):
        if entry["kind"].startswith("conv2d") != convolutions:
            continue
        times = entry["times_ms"]
        first, best = times.get(configs[0].name), times[entry["config"]]
        gain = f"{first / best:.2f}" if isinstance(first, float) else "first cannot run it"
        cells = [f"{times[c.name]:.4f}" if isinstance(times.get(c.name), float) else "-" for c in configs]
        found.append([entry["kind"], _size(entry), *cells, entry["config"], gain])
    return found


def main() -> None:
    print(f"CUTLASS tuning on this machine (cache {library.cache_dir()}), median ms per configuration:")
    gains = []
    for convolutions, size, configs in ((False, "M x N x K", TILE_CONFIGS), (True, "NxHxWxC -> K, RxS", CONV_TILE_CONFIGS)):
        table = rows(convolutions)
        if not table:
            continue
        header = ["kind", size, *(c.name for c in configs), "chosen", "gain over the first"]
        print("\n| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in table:
            print("| " + " | ".join(row) + " |")
        gains += [float(row[-1]) for row in table if row[-1][0].isdigit()]
    table = tuning.tuned()
    seconds = library.compile_seconds()
    print(
        f"\n{len(table)} problems tuned; geomean gain over the first configuration {statistics.geometric_mean(gains):.2f}"
        if gains
        else f"\n{len(table)} problems tuned"
    )
    tuning_s = sum(entry.get("seconds", 0.0) for entry in tuning.tuned())
    print(f"tuning took {tuning_s:.1f} s in all (compiling what was not built, loading and timing each configuration)")
    print(
        f"{len(seconds)} kernels compiled in {sum(seconds.values()):.0f} nvcc seconds "
        f"(median {statistics.median(seconds.values()) if seconds else 0:.0f} s each)"
    )


if __name__ == "__main__":
    main()
