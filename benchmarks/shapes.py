"""One library for several shapes against a run per shape, and against ONNX Runtime at each shape.

Usage: python benchmarks/shapes.py MODEL.onnx --shapes "input_ids=1x32,1x64,1x128" [--out benchmarks/raw-shapes/NAME]
       [--backends A,B] [--skip-separate]

For a model with symbolic dimensions (``python scripts/make_hf_models.py --model bert-base --dynamic``):

1. ``collage optimize MODEL --shapes ...`` from an empty cost database: its wall time, each shape's latency in the
   one library and in its own run's library (timed in turns by the run), numerics;
2. one ``collage optimize`` per shape on a static copy of the file, each from an empty cost database of its own:
   the wall time of each (``--skip-separate`` leaves this out);
3. ONNX Runtime's default session on the original file at each shape (median of warm runs, Collage's thread settings).

Each step is kept in the output folder as it ends (``shapes.json``, ``separate-K.json``, ``onnxruntime.json``), and
a rerun skips what is there, so a run cut short resumes. The table is printed and written to ``table.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collage_core.model.shape_profiles import parse_shapes, static_onnx, symbolic_inputs  # noqa: E402


def run(command: list[str], log: Path) -> float:
    """Run ``command`` with its output in ``log``; its wall time in seconds (fails loudly)."""
    started = time.perf_counter()
    with log.open("w") as out:
        subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=True, cwd=ROOT)
    return time.perf_counter() - started


def kept(path: Path, make) -> dict:
    if path.exists():
        return json.loads(path.read_text())
    value = make()
    path.write_text(json.dumps(value, indent=1, sort_keys=True) + "\n")
    return value


def collage(model: Path, out: Path, extra: list[str], backends: str | None) -> list[str]:
    command = [sys.executable, "-m", "collage_core", "optimize", str(model), "-o", str(out), "--cost-db", str(out) + ".sqlite"]
    return command + (["--backends", backends] if backends else []) + extra


def onnxruntime_ms(model: Path, profiles, inputs, runs: int = 20) -> list[float]:
    import onnxruntime

    from collage_core.model.padding import probe_inputs

    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    found = []
    for profile in profiles:
        arrays = probe_inputs(inputs, [shape for _, shape in profile.shapes])
        feeds = {spec.name: array for spec, array in zip(inputs, arrays)}
        for _ in range(3):
            session.run(None, feeds)
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            session.run(None, feeds)
            times.append(time.perf_counter() - started)
        found.append(1e3 * float(np.median(times)))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--shapes", required=True)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--backends", default=None)
    parser.add_argument("--skip-separate", action="store_true")
    args = parser.parse_args()
    out = args.out or ROOT / "benchmarks" / "raw-shapes" / args.model.stem
    out.mkdir(parents=True, exist_ok=True)
    proto = onnx.load(str(args.model), load_external_data=False)
    inputs = symbolic_inputs(proto)
    profiles = parse_shapes(args.shapes, inputs)

    def together():
        wall = run(collage(args.model, out / "together", ["--shapes", args.shapes], args.backends), out / "together.log")
        results = json.loads((out / "together" / "results.json").read_text())
        return {"wall_s": wall, "results": results}

    shapes = kept(out / "shapes.json", together)
    separate = []
    if not args.skip_separate:
        full = onnx.load(str(args.model))
        for index, profile in enumerate(profiles):
            static = out / f"static-{index + 1}" / f"{args.model.stem}.onnx"

            def alone(static=static, profile=profile, index=index):
                static.parent.mkdir(parents=True, exist_ok=True)
                onnx.save(static_onnx(full, profile), str(static))
                wall = run(collage(static, out / f"separate-{index + 1}", [], args.backends), out / f"separate-{index + 1}.log")
                results = json.loads((out / f"separate-{index + 1}" / "results.json").read_text())
                return {"wall_s": wall, "latency_s": results["end_to_end"][0]["cost"].get("median_s")}

            separate.append(kept(out / f"separate-{index + 1}.json", alone))
    peers = kept(out / "onnxruntime.json", lambda: {"ms": onnxruntime_ms(args.model, profiles, inputs)})
    table = render(args.model.name, profiles, shapes, separate, peers)
    (out / "table.md").write_text(table + "\n")
    print(table)
    return 0


def render(model: str, profiles, shapes: dict, separate: list, peers: dict) -> str:
    checks = [check for check in shapes["results"]["checks"] if not check["padded"]]
    per_shape = shapes["results"]["per_shape"]
    lines = [
        f"{model}, {os.cpu_count()} cores: one library for {len(profiles)} shapes against a run per shape",
        "",
        "| shape | its own run (ms) | in the library, in turns (ms) | its own library, in turns (ms) | separate run (ms) | ONNX Runtime (ms) | operators by backend |",
        "|---|---|---|---|---|---|---|",
    ]
    for index, profile in enumerate(profiles):
        check = checks[index]
        own = per_shape[index]["end_to_end"][0]
        alone = separate[index]["latency_s"] if index < len(separate) and separate[index].get("latency_s") else None
        backends = ", ".join(f"{b} {n}" for b, n in sorted(own["operators_by_backend"].items()))
        lines.append(
            f"| {profile.label} | {_ms(own['cost'].get('median_s'))} | {_ms(check.get('in_library_s'))} | {_ms(check.get('alone_s'))} | "
            f"{_ms(alone)} | {peers['ms'][index]:.2f} | {backends} |"
        )
    padded = [check for check in shapes["results"]["checks"] if check["padded"]]
    lines.append("")
    phases = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in shapes["results"]["phases_s"].items())
    lines.append(f"one run for every shape: {shapes['wall_s']:.0f} s wall ({phases})")
    if separate:
        each = ", ".join(f"{s['wall_s']:.0f}" for s in separate)
        lines.append(f"a run per shape: {sum(s['wall_s'] for s in separate):.0f} s wall in all ({each})")
    for check in padded:
        verdict = "passed" if check["numerics"]["passed"] else "FAILED"
        lines.append(f"padded {check['label']}: numerics {verdict} (max abs error {check['numerics']['max_abs_error']:.3g})")
    return "\n".join(lines)


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


if __name__ == "__main__":
    sys.exit(main())
