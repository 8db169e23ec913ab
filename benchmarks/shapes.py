"""One library for several shapes against a run per shape, and against the peers at each shape.

Usage: python benchmarks/shapes.py MODEL.onnx --shapes "input_ids=1x32,1x64,1x128" [--out benchmarks/raw-shapes/NAME]
       [--backends A,B] [--skip-separate] [--target cuda --torch-peer bert-base]

For a model with symbolic dimensions (``python scripts/make_hf_models.py --model bert-base --dynamic``):

1. ``collage optimize MODEL --shapes ...`` from an empty cost database: its wall time, each shape's latency in the
   one library and in its own run's library (timed in turns by the run), numerics;
2. ``collage export MODEL --placement together/placements.json``: one Model Library Format tar for every shape, its
   wall time and size; then, in a new process, the tar loaded with ``load_mlf`` and run at each shape and at the
   shape between them that the run checked padded, each against ONNX Runtime on the original file (rtol 1e-3,
   atol 1e-4; probe inputs: integer inputs of ones, floats uniform in [-1, 1]);
3. the peers at each shape: on the CPU, ONNX Runtime's default session on the original file (median of warm runs,
   Collage's thread settings); with ``--target cuda``, PyTorch eager and torch.compile ("reduce-overhead": CUDA
   graphs) on the GPU, running the module ``--torch-peer`` names (``scripts/make_hf_models.py``'s BERT, taking token
   ids and an attention mask as the dynamic ONNX file does), compiled for each shape in a process of its own.
4. one ``collage optimize`` per shape on a static copy of the file, each from an empty cost database of its own:
   the wall time of each (``--skip-separate`` leaves this out).

Each step is kept in the output folder as it ends (``shapes.json``, ``export.json``, ``peers.json``,
``separate-K.json``), and a rerun skips what is there, so a run cut short resumes (the export needs the first step's
placements, which only its own folder holds: a rerun that finds ``shapes.json`` but not ``together/placements.json``
starts again from the first step). The table is printed and written to ``table.md``.
``--skip-separate`` and ``--skip-export`` leave those steps out.
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


def collage(model: Path, out: Path, extra: list[str], backends: str | None, target: str | None) -> list[str]:
    command = [sys.executable, "-m", "collage_core", "optimize", str(model), "-o", str(out), "--cost-db", str(out) + ".sqlite"]
    return command + (["--backends", backends] if backends else []) + (["--target", target] if target else []) + extra


# One PyTorch peer on the GPU at one shape, in a process of its own: argv = scripts folder, model name, mode, batch, sequence.
TORCH_PEER_CODE = r"""
import json, sys, time
import numpy as np
import torch
sys.path.insert(0, sys.argv[1])
import make_hf_models as models
name, mode, batch, sequence = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # float32 as Collage computes it
model, ids, _ = models.module_and_input(name, batch, sequence)
model = models.MaskedLastHiddenState(model.encoder).eval().cuda()
ids = ids.cuda()
mask = torch.ones_like(ids)
run = torch.compile(model, mode=mode, dynamic=False) if mode != "eager" else model
def once():
    with torch.inference_mode():
        out = run(ids, mask)
    torch.cuda.synchronize()
    return out
started = time.perf_counter()
once()
compile_s = time.perf_counter() - started
for _ in range(3):
    once()
samples = []
while len(samples) < 50 and sum(samples) < 10.0:
    begin = time.perf_counter()
    once()
    samples.append(time.perf_counter() - begin)
print(json.dumps({"ms": 1e3 * float(np.median(samples)), "compile_s": compile_s, "torch": torch.__version__}))
"""
TORCH_PEER_MODES = ("eager", "reduce-overhead")


def torch_peer_ms(name: str, profiles, inputs) -> dict:
    """PyTorch eager and torch.compile at each shape on the GPU: {mode: [ms per shape]} (None where it failed)."""
    found = {}
    for mode in TORCH_PEER_MODES:
        found[mode] = []
        for profile in profiles:
            batch, sequence = dict(profile.shapes)[inputs[0].name]
            done = subprocess.run(
                [sys.executable, "-c", TORCH_PEER_CODE, str(ROOT / "scripts"), name, mode, str(batch), str(sequence)],
                capture_output=True,
                text=True,
                timeout=600,
            )
            if done.returncode != 0:
                print(f"{mode} at {profile.label} failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                found[mode].append(None)
                continue
            found[mode].append(json.loads(done.stdout.strip().splitlines()[-1])["ms"])
    return found


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
    parser.add_argument("--skip-export", action="store_true")
    parser.add_argument("--target", default=None, help="passed to collage optimize (cuda: the peers are PyTorch's on the GPU)")
    parser.add_argument("--torch-peer", default="bert-base", help="with --target cuda: the make_hf_models.py model the peers run")
    args = parser.parse_args()
    out = args.out or ROOT / "benchmarks" / "raw-shapes" / args.model.stem
    out.mkdir(parents=True, exist_ok=True)
    proto = onnx.load(str(args.model), load_external_data=False)
    inputs = symbolic_inputs(proto)
    profiles = parse_shapes(args.shapes, inputs)

    def together():
        wall = run(collage(args.model, out / "together", ["--shapes", args.shapes], args.backends, args.target), out / "together.log")
        results = json.loads((out / "together" / "results.json").read_text())
        return {"wall_s": wall, "results": results, "cores": os.cpu_count(), "device": _device(args.target)}

    placements = out / "together" / "placements.json"
    if not args.skip_export and not (out / "export.json").exists() and (out / "shapes.json").exists() and not placements.exists():
        print(f"{placements} is gone: the run for every shape is made again, for the export to rebuild its placements", file=sys.stderr)
        (out / "shapes.json").unlink()
    shapes = kept(out / "shapes.json", together)
    # The export rebuilds the run's placements (together/placements.json, which is not kept), so it follows the run.
    exported = None
    if not args.skip_export:
        exported = kept(out / "export.json", lambda: export_and_check(args.model, out, args.target, profiles, inputs, shapes))
    if args.target == "cuda":
        peers = kept(
            out / "peers.json", lambda: {f"PyTorch {mode}": ms for mode, ms in torch_peer_ms(args.torch_peer, profiles, inputs).items()}
        )
    else:
        peers = kept(out / "peers.json", lambda: {"ONNX Runtime": onnxruntime_ms(args.model, profiles, inputs)})
    separate = []
    if not args.skip_separate:
        full = onnx.load(str(args.model))
        for index, profile in enumerate(profiles):
            static = out / f"static-{index + 1}" / f"{args.model.stem}.onnx"

            def alone(static=static, profile=profile, index=index):
                static.parent.mkdir(parents=True, exist_ok=True)
                onnx.save(static_onnx(full, profile), str(static))
                wall = run(
                    collage(static, out / f"separate-{index + 1}", [], args.backends, args.target), out / f"separate-{index + 1}.log"
                )
                results = json.loads((out / f"separate-{index + 1}" / "results.json").read_text())
                return {"wall_s": wall, "latency_s": results["end_to_end"][0]["cost"].get("median_s")}

            separate.append(kept(out / f"separate-{index + 1}.json", alone))
    table = render(args.model.name, profiles, shapes, separate, peers, exported)
    (out / "table.md").write_text(table + "\n")
    print(table)
    return 0


# In a process of its own, as a deployment loads it: argv = tar, original model, then "NAME=AxB;NAME=AxB" per shape.
LOAD_CHECK_CODE = r"""
import json, sys, time
import numpy as np, onnx, onnxruntime
from collage_core.model.padding import probe_inputs
from collage_core.model.shape_profiles import symbolic_inputs
from collage_core.outputs.mlf import load_mlf
started = time.perf_counter()
loaded = load_mlf(sys.argv[1])
load_s = time.perf_counter() - started
session = onnxruntime.InferenceSession(sys.argv[2], providers=["CPUExecutionProvider"])
specs = symbolic_inputs(onnx.load(sys.argv[2], load_external_data=False))
found = []
for shape in sys.argv[3:]:
    shapes = dict((name, tuple(int(s) for s in sizes.split("x"))) for name, sizes in (item.split("=") for item in shape.split(";")))
    arrays = probe_inputs(specs, [shapes[spec.name] for spec in specs], seed=7)
    outputs = loaded.run(*arrays)
    expected = session.run(None, {spec.name: array for spec, array in zip(specs, arrays)})
    errors = [float(np.abs(np.asarray(o, dtype=np.float64) - e).max()) for o, e in zip(outputs, expected)]
    passed = all(np.allclose(o, e, rtol=1e-3, atol=1e-4) for o, e in zip(outputs, expected))
    found.append({"shape": shape, "max_abs_error": max(errors), "passed": bool(passed)})
print(json.dumps({"load_s": load_s, "runs": found}))
"""


def export_and_check(model: Path, out: Path, target: str | None, profiles, inputs, shapes: dict) -> dict:
    """One tar for every shape (``collage export``), then loaded in a new process and run at each shape and the
    padded one, against ONNX Runtime."""
    tar = out / "together.tar"
    command = [sys.executable, "-m", "collage_core", "export", str(model), "--placement", str(out / "together" / "placements.json")]
    wall = run(command + ["-o", str(tar)] + (["--target", target] if target else []), out / "export.log")
    checked = [check for check in shapes["results"]["checks"] if check["padded"]]
    listed = [";".join(f"{name}={'x'.join(map(str, shape))}" for name, shape in profile.shapes) for profile in profiles]
    padded = [_padded_shape(check["label"], inputs) for check in checked]
    done = subprocess.run(
        [sys.executable, "-c", LOAD_CHECK_CODE, str(tar), str(model), *listed, *padded],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return {"wall_s": wall, "bytes": tar.stat().st_size, **json.loads(done.stdout.strip().splitlines()[-1])}


def _padded_shape(label: str, inputs) -> str:
    """``batch=5 sequence=80`` as each input's shape."""
    sizes = {name: int(size) for name, size in (item.split("=") for item in label.split())}
    return ";".join(f"{spec.name}={'x'.join(str(d if isinstance(d, int) else sizes[d]) for d in spec.dims)}" for spec in inputs)


def render(model: str, profiles, shapes: dict, separate: list, peers: dict, exported: dict | None = None) -> str:
    checks = [check for check in shapes["results"]["checks"] if not check["padded"]]
    per_shape = shapes["results"]["per_shape"]
    lines = [
        f"{model}, {shapes.get('device') or 'this CPU'}, {shapes.get('cores', os.cpu_count())} cores: one library for {len(profiles)} shapes"
        + (" against a run per shape" if separate else ""),
        "",
        "| shape | its own run (ms) | in the library, in turns (ms) | its own library, in turns (ms) | separate run (ms) | "
        + "".join(f"{peer} (ms) | " for peer in peers)
        + "operators by backend |",
        "|---|---|---|---|---|" + "---|" * len(peers) + "---|",
    ]
    for index, profile in enumerate(profiles):
        check = checks[index]
        own = per_shape[index]["end_to_end"][0]
        alone = separate[index]["latency_s"] if index < len(separate) and separate[index].get("latency_s") else None
        backends = ", ".join(f"{b} {n}" for b, n in sorted(own["operators_by_backend"].items()))
        lines.append(
            f"| {profile.label} | {_ms(own['cost'].get('median_s'))} | {_ms(check.get('in_library_s'))} | {_ms(check.get('alone_s'))} | "
            f"{_ms(alone)} | "
            + "".join(f"{_ms(None if ms[index] is None else ms[index] / 1e3)} | " for ms in peers.values())
            + f"{backends} |"
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
    if exported:
        lines.append(
            f"one tar: written in {exported['wall_s']:.0f} s, {exported['bytes'] / 1e6:.0f} MB, loaded in a new process in "
            f"{exported['load_s']:.1f} s; against ONNX Runtime: "
            + ", ".join(f"{r['shape']} {'passed' if r['passed'] else 'FAILED'} ({r['max_abs_error']:.2g})" for r in exported["runs"])
        )
    return "\n".join(lines)


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}" if seconds < 0.01 else f"{seconds * 1e3:.2f}"


def _device(target: str | None) -> str | None:
    """The GPU's name for a CUDA target (None on the CPU)."""
    if target != "cuda":
        return None
    import torch

    return torch.cuda.get_device_name(0)


if __name__ == "__main__":
    sys.exit(main())
