"""Collage's contest against the benchmark's turns on the same libraries: do they time them alike?

Builds each placement file given (e.g. a run's ``placement.json`` and ``baselines/*.json``) into a library,
then times all of them in turns twice, one after the other: as Collage's contest does
(``collage_core.measure.in_turns.time_in_turns``, measurement workers forked from the zygote, default settings)
and as the benchmark does (``benchmarks/interleaved.py``, a plain process per library loading it with
``collage_core.build.deploy.load_vm``, two processes each). Prints one table: per library, each side's warm
latency back to back and its latency after a pause (each side's fastest worker or process), and the
ratio of the warm latencies.

    python benchmarks/contest_vs_interleaved.py MODEL.onnx PLACEMENT.json [PLACEMENT.json ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import interleaved  # noqa: E402

import collage_core  # noqa: E402
from collage_core import tvm_compat  # noqa: E402
from collage_core.measure.in_turns import time_in_turns  # noqa: E402


def build_libraries(model: Path, placements: list[Path], out: Path) -> tuple[dict[str, Path], Path]:
    """Each placement built into a library under ``out`` (named by its file's stem), and the inputs they run on."""
    libraries, inputs = {}, out / "inputs.npz"
    for placement in placements:
        name = placement.stem if placement.name != "placement.json" else "placement"
        built = collage_core.optimize(
            str(model), placement=placement, compare_backends=False, verify=False, output_dir=out / name, show_progress=False
        )
        libraries[name] = built.library_path
        if not inputs.exists():
            np.savez(inputs, *built.model.random_inputs())
    return libraries, inputs


def compare(libraries: dict[str, Path], inputs: Path) -> list[list[str]]:
    """The table's rows: each library timed in turns by the contest and by the benchmark."""
    contest = time_in_turns(libraries, inputs, tvm_compat.target_to_json(tvm_compat.host_cpu_target()), [], [])
    kinds = {f"{interleaved.COLLAGE} {name}": name for name in libraries}
    bench = interleaved.measure("", 1, Path(), contenders=[(kind, libraries[name]) for kind, name in kinds.items()], inputs=inputs)[
        "contenders"
    ]
    rows = []
    for kind, name in kinds.items():
        ours, theirs = contest[name], bench[kind]
        warm, paused = min(theirs["process_medians_s"]), min(theirs["process_after_pause_medians_s"])
        rows.append(
            [
                name,
                f"{ours.warm.median_s * 1e3:.2f}",
                f"{ours.after_pause.median_s * 1e3:.2f}",
                f"{warm * 1e3:.2f}",
                f"{paused * 1e3:.2f}",
                f"{ours.warm.median_s / warm:.3f}",
            ]
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("placements", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, help="where the libraries are built (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="collage-contest-vs-interleaved-") as tmp:
        libraries, inputs = build_libraries(args.model, args.placements, args.out or Path(tmp))
        rows = compare(libraries, inputs)
    from collage_core.outputs.report import format_table

    print(
        format_table(
            [
                "library",
                "contest warm ms",
                "contest after pause ms",
                "interleaved warm ms",
                "interleaved after pause ms",
                "contest / interleaved, warm",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
