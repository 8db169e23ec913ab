"""One library for several shapes against a run per shape, and against the peers at each shape.

Usage: python benchmarks/shapes.py MODEL.onnx --shapes "input_ids=1x32,1x64,1x128" [--out benchmarks/raw-shapes/NAME]
       [--backends A,B] [--skip-separate] [--target cuda --torch-peer bert-base]

For a model with symbolic dimensions (``python scripts/make_hf_models.py --model bert-base --dynamic``):

1. ``collage optimize MODEL --shapes ...`` from an empty cost database: its wall time, each shape's latency in the
   one library and in its own run's library (timed in turns by the run), numerics;
2. the peers at each shape: on the CPU, ONNX Runtime's default session on the original file (median of warm runs,
   Collage's thread settings); with ``--target cuda``, PyTorch eager and torch.compile ("reduce-overhead": CUDA
   graphs) on the GPU, running the module ``--torch-peer`` names (``scripts/make_hf_models.py``'s BERT, taking token
   ids and an attention mask as the dynamic ONNX file does), compiled for each shape in a process of its own.
3. one ``collage optimize`` per shape on a static copy of the file, each from an empty cost database of its own:
   the wall time of each (``--skip-separate`` leaves this out);

Each step is kept in the output folder as it ends (``shapes.json``, ``separate-K.json``, ``peers.json``), and
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

    shapes = kept(out / "shapes.json", together)
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
    table = render(args.model.name, profiles, shapes, separate, peers)
    (out / "table.md").write_text(table + "\n")
    print(table)
    return 0


def render(model: str, profiles, shapes: dict, separate: list, peers: dict) -> str:
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
