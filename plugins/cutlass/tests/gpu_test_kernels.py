"""The CUTLASS kernels this plugin's GPU tests compile, compiled ahead of time (nvcc, no GPU needed).

    python plugins/cutlass/tests/gpu_test_kernels.py [--dry-run]

The GPU tests (test_cutlass_kernels.py, test_cutlass_placements.py) compile each kernel when it is first
lowered, one test after another; compiled here first, all at once and in parallel, into
``$COLLAGE_CACHE_DIR/cutlass/``, the tests find them built (``scripts/gpu-tests.sh`` does this; copied to
a GPU machine with the same nvcc, CUTLASS and TVM FFI, the cache spares it the compiling). The kernels are
those of every problem the tests place on CUTLASS, each in the configurations the tests try (the first two,
or ``$COLLAGE_CUTLASS_TILES``), and the stream-K kernel one test runs by name.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from collage_cutlass import patterns, prebuild, specs

from collage_core.kit import Group, at_precision, load_model
from collage_core.kit.testing import function_module, product_case, whole_candidate

TESTS_CONFIGURATIONS = "2"  # what the GPU tests try unless COLLAGE_CUTLASS_TILES says otherwise
MODELS = Path(__file__).resolve().parents[3] / "models"
PLACEMENT_MODELS = ("tiny_bert", "tiny_gpt2")  # test_cutlass_placements.py's, at fp16


def _kind(mod, pattern_name: str, tf32: bool = False):
    graph, candidate = whole_candidate(mod, patterns.patterns(tf32=tf32), f"cutlass.{pattern_name}{'_tf32' if tf32 else ''}")
    if candidate is None:
        raise LookupError(f"no cutlass.{pattern_name} candidate")
    return specs.recognize(Group.from_function(graph.standalone_module(candidate.nodes)["main"]), tf32=tf32).kind


def _kernel_tests():
    """test_cutlass_kernels.py, whose problems these are (this folder is not a package)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import test_cutlass_kernels

    return test_cutlass_kernels


def kinds() -> set:
    """The kernel kinds of every problem the GPU tests place on CUTLASS."""
    tests = _kernel_tests()
    found = set()
    for dtype in ("bfloat16", "float16"):
        for name in tests.CASES:
            make, shapes = product_case(name, cast_to=dtype)
            found.add(_kind(function_module(make, *shapes, dtype=dtype), name))
    for name in tests.TF32_CASES:
        make, shapes = product_case(name)
        found.add(_kind(function_module(make, *shapes), name, tf32=True))
    found.add(_kind(tests.sixteen_bit_product_to_float32()[0], "dense"))
    for case, (make, shapes, dtype) in tests.CONV_CASES.items():
        found.add(_kind(function_module(make, *shapes, dtype=dtype), case.split("__")[0]))
    found.add(_kind(tests.tf32_convolution(), "conv2d_relu", tf32=True))
    for model in PLACEMENT_MODELS:
        found |= prebuild.kinds_in(at_precision(load_model(str(MODELS / f"{model}.onnx")), "fp16").mod["main"])
    return found


def kernels() -> list:
    """Each kind in the configurations the tests try, and the stream-K kernel."""
    import numpy as np

    os.environ.setdefault("COLLAGE_CUTLASS_TILES", TESTS_CONFIGURATIONS)
    wanted = prebuild.kernels_for(kinds())
    streamk = _kernel_tests().stream_k_problem(np.random.default_rng(5))[2]
    return wanted + ([streamk] if streamk not in wanted else [])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="count the kernels, compile nothing")
    args = parser.parse_args(argv)
    wanted = kernels()
    return prebuild.compile_kernels(wanted, f"{len(wanted)} kernels for the GPU tests", args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
