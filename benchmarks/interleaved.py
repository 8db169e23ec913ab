"""Collage's library and the peers timed in turns, so a machine whose speed drifts favours none of them.

On a shared 2-core VM the same ONNX Runtime session measures 30 ms one minute and 45 ms the next.
Configurations timed minutes apart cannot be compared at that resolution, so the headline numbers
come from here: each contender is set up once in each of its processes (ONNX Runtime's default
session, PyTorch eager, ``torch.compile``, and Collage's exported library loaded with
``collage_core.build.deploy.load_vm``), then the processes take turns, a short burst each, for several
rounds. Only the running process works; the others wait on a pipe, so their threads sleep.

Each turn is one run after a pause (the process sat idle while the others ran) and then runs back to back
(at least one), as Collage's contest times them (``collage_core.measure.in_turns``); the two are kept apart.
Each contender's median and interquartile range are over the warm runs, back to back, of all its
processes, and each process's warm median is kept: the report (``peers_report.py``) times a contender
by its fastest process, as a process keeps its own luck and that luck only slows. The first runs of the
turns give ``after_pause_median_s`` and each process's ``process_after_pause_medians_s``. (Before, every
run of a turn was pooled, so that a contender whose run is long, with few runs a turn, was timed mostly
after pauses and one whose run is short mostly back to back.)

    python benchmarks/interleaved.py MODEL BATCH LIBRARY [--single LIBRARY] [--rounds 9] [--processes 2]
                                                                        (prints one JSON line)

``measure(..., contenders=[(f"{COLLAGE} <name>", library), ...], inputs=npz)`` times any libraries on
saved inputs instead of a model made by ``scripts/make_hf_models.py`` (benchmarks/contest_vs_interleaved.py).

``--single`` adds the best single backend's build (a baseline ``collage optimize`` measured,
rebuilt from its placement file) as one more contender, so that Collage's ratio to it is timed
in turns too.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers_report import PEERS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
COLLAGE = "collage library"
SINGLE = "best single backend library"
LIBRARIES = (COLLAGE, SINGLE)  # contenders that are libraries `collage optimize` wrote
BURST_S = 0.4  # each turn runs a contender about this long back to back (at least one run), after its run after a pause
# How a turn is split, recorded in each result: files without it pooled every run of a turn.
TURNS = "a run after a pause, then warm runs back to back; medians of the warm runs"
ROUNDS = 9
# Processes per contender. Each process keeps its own luck: the same library timed in two processes
# side by side differs by up to a tenth, and GPT-2 b8 in OpenVINO by a third. Each one's median is kept.
PROCESSES = 2
# Peers at lower precision (benchmarks/precision.py): PyTorch's CPU autocast, OpenVINO's inference precision hint.
TORCH_BF16 = "pytorch eager, bf16 autocast"
OPENVINO_PRECISIONS = {"openvino default session (fp32)": "f32", "openvino default session (bf16)": "bf16"}


def _contender_function(kind: str, name: str, batch: int, library: str, inputs: Optional[str] = None):
    """Set up one contender; returns a function running the model once on a fixed input (a library's on
    ``inputs``, an ``.npz``, where given)."""
    if inputs is not None:
        return _library_function(library, inputs)
    sys.path.insert(0, str(SCRIPTS))
    import make_hf_models as models

    model, example, input_name = models.module_and_input(name, batch)
    if kind == "onnxruntime default session":
        import onnxruntime

        onnx_path = ROOT / "models" / "hf" / f"{models.file_stem(name, batch)}.onnx"
        session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        feeds = {input_name: example.numpy()}
        return lambda: session.run(None, feeds)
    if kind in OPENVINO_PRECISIONS:
        import openvino

        onnx_path = ROOT / "models" / "hf" / f"{models.file_stem(name, batch)}.onnx"
        compiled = openvino.Core().compile_model(str(onnx_path), "CPU", {"INFERENCE_PRECISION_HINT": OPENVINO_PRECISIONS[kind]})
        request, feeds = compiled.create_infer_request(), {input_name: example.numpy()}
        return lambda: request.infer(feeds)
    if kind in LIBRARIES or kind.startswith(f"{COLLAGE} "):
        return _library_function(library, None, example.numpy())
    import torch

    if kind == "torch.compile (inductor)":
        model = torch.compile(model)
    autocast = kind == TORCH_BF16

    def run():
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            model(example)

    return run


def _library_function(library: str, inputs: Optional[str], example=None):
    """A library `collage optimize` wrote, loaded as a user loads it, run on the arrays in ``inputs`` (an
    ``.npz``) or on ``example``."""
    from collage_core import tvm_compat
    from collage_core.build.deploy import load_vm

    vm = load_vm(library)
    device = tvm_compat.device_for(tvm_compat.host_cpu_target())
    if inputs is None:
        arrays = [example]
    else:
        with np.load(inputs, allow_pickle=False) as saved:
            arrays = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    arguments = [tvm_compat.to_tensor(array, device) for array in arrays]
    return lambda: vm["main"](*arguments)


def started_as_told(library: Path) -> Optional[dict]:
    """The environment a library's process starts with: what its runtime file says the deployment should set
    (how idle threads wait, where backends' pools take turns), as ``load_library`` tells a user; None (this
    process's own) for a library that records nothing."""
    from collage_core.build.deploy import LibraryLoadError, read_runtime_file

    try:
        told = read_runtime_file(library).get("environment") or {}
    except LibraryLoadError:
        return None
    return {**os.environ, **told} if told else None


def serve(kind: str, name: str, batch: int, library: str, inputs: Optional[str] = None) -> None:
    """The contender's side: set up, warm up, then answer ``n`` with the seconds of ``n`` runs."""
    protocol = sys.stdout
    sys.stdout = sys.stderr
    started = time.perf_counter()
    function = _contender_function(kind, name, batch, library, inputs)
    for _ in range(3):
        function()
    once = time.perf_counter()
    function()
    protocol.write(json.dumps({"setup_s": once - started, "once_s": time.perf_counter() - once}) + "\n")
    protocol.flush()
    for line in sys.stdin:
        count = int(line)
        samples = []
        for _ in range(count):
            begin = time.perf_counter()
            function()
            samples.append(time.perf_counter() - begin)
        protocol.write(json.dumps(samples) + "\n")
        protocol.flush()


def measure(
    name: str,
    batch: int,
    library: Path,
    rounds: int = ROUNDS,
    single: Optional[Path] = None,
    processes: int = PROCESSES,
    contenders: Optional[list] = None,
    inputs: Optional[Path] = None,
) -> dict:
    """Every contender's median and IQR over its warm runs in ``rounds`` interleaved turns, and its median
    after a pause (JSON-ready), each contender served by ``processes`` processes that take their turns like
    separate contenders. ``contenders`` ((kind, library) pairs) replaces the peers, Collage's library and
    ``single``; with ``inputs`` (an ``.npz``) they are all libraries, run on those arrays."""
    if contenders is None:
        contenders = [(peer, library) for peer in PEERS] + [(COLLAGE, library)] * library.exists()
        if single is not None and single.exists():
            contenders.append((SINGLE, single))
    servers, results = {}, {}
    for kind, path in contenders:  # set up one at a time: a compiling contender would slow another's warm-up
        for copy in range(processes):
            process = subprocess.Popen(
                [sys.executable, __file__, "--serve", kind, name, str(batch), str(path), *([str(inputs)] if inputs else [])],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=ROOT,
                env=started_as_told(Path(path)) if kind in LIBRARIES or inputs else None,  # the peers as they are
            )
            line = process.stdout.readline()
            if not line:
                process.wait()
                results[kind] = {"error": f"{kind} could not be set up (exit code {process.returncode})"}
                for started in range(copy):
                    servers.pop((kind, started))[0].stdin.close()
                break
            servers[kind, copy] = process, json.loads(line), [], []
    for round_index in range(rounds):
        order = list(servers)
        order = order[round_index % len(order) :] + order[: round_index % len(order)]  # rotate who goes first
        for key in order:
            process, ready, warm, after_pause = servers[key]
            run_s = max(float(np.median(warm)) if warm else ready["once_s"], 1e-6)
            process.stdin.write(f"{1 + max(1, int(BURST_S / run_s))}\n")  # a run after the pause, then the warm runs
            process.stdin.flush()
            first, *rest = json.loads(process.stdout.readline())
            after_pause.append(first)
            warm += rest
    for (kind, copy), (process, ready, warm, after_pause) in servers.items():
        process.stdin.close()
        process.wait()
        result = results.setdefault(
            kind,
            {
                "setup_s": ready["setup_s"],
                "once_s": ready["once_s"],
                "samples_s": [],
                "process_medians_s": [],
                "after_pause_s": [],
                "process_after_pause_medians_s": [],
            },
        )
        result["samples_s"] += warm
        result["process_medians_s"].append(float(np.median(warm)))
        result["after_pause_s"] += after_pause
        result["process_after_pause_medians_s"].append(float(np.median(after_pause)))
    for kind, result in results.items():
        if "samples_s" in result:
            samples = result.pop("samples_s")
            q1, median, q3 = np.percentile(samples, [25, 50, 75])
            result.update(
                median_s=float(median),
                spread_s=float(q3 - q1),
                repeats=len(samples),
                after_pause_median_s=float(np.median(result.pop("after_pause_s"))),
            )
    return {"rounds": rounds, "burst_s": BURST_S, "processes": processes, "turns": TURNS, "contenders": results}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        kind, name, batch, library = sys.argv[2:6]
        serve(kind, name, int(batch), library, *sys.argv[6:7])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("batch", type=int)
    parser.add_argument("library", type=Path, help="the library `collage optimize` wrote (<output>/<model>.so)")
    parser.add_argument("--single", type=Path, help="the best single backend's library, timed in turns too")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--processes", type=int, default=PROCESSES, help="processes per contender")
    args = parser.parse_args()
    print(json.dumps(measure(args.model, args.batch, args.library, args.rounds, args.single, args.processes)))


if __name__ == "__main__":
    main()
