"""What a cold and a warm `collage optimize` cost, phase by phase, before and after a change.

For each model, each variant (``after``: this checkout; ``before``: the Collage core at another
git revision, ``--before REF``, run from a worktree with its own plugins, through the entry points
installed here: a run reports a plugin it could not import, whose backend it then went without) runs
``collage optimize`` cold (an empty cost database, compile cache and output directory), then the
same command again (warm). The variants take turns: before cold, after cold, before warm, after
warm. The table gives each run's wall time and its phases (``phases_s`` of ``results.json``),
then the libraries each variant returned timed in turns in one sitting, so a faster search that
returned a slower placement shows.

Run:
    python benchmarks/search_speed.py                                  # quickstart, this checkout
    python benchmarks/search_speed.py --models quickstart,bert-base,gpt2 --before HEAD~5
    python benchmarks/search_speed.py --models bert-base,gpt2 --batches 8 --before REF   # CI-free: hours
    python benchmarks/search_speed.py --models gpt2 --batches 8 --logs logs/   # each run's log kept: where the time went
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

PHASES = [
    "import and candidates",
    "measuring candidates",
    "search and calibration",
    "building and verifying",
    "baselines",
    "contest in turns",
    "reusing the run before",
]
SHORT = {
    "import and candidates": "import",
    "measuring candidates": "measure",
    "search and calibration": "search",
    "building and verifying": "build",
    "baselines": "baselines",
    "contest in turns": "contest",
    "reusing the run before": "reuse",
}


def model_file(name: str, batch: int) -> Path:
    if name == "quickstart":
        return ROOT / "models" / "tiny_resnet.onnx"
    import peers  # builds the transformers model's ONNX file when it is missing

    return peers._onnx_file(name, batch)


def worktree(ref: str, where: Path) -> Path:
    """A checkout of ``ref`` under ``where``, for running the Collage core as it was."""
    path = where / "before"
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(path), ref], cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return path


def code_path(core: Path) -> list[str]:
    """What goes first on the path to run the checkout ``core`` as it was: its core and its own plugins
    (the installed plugins' entry points then load those: plugins of this checkout may need a newer core)."""
    return [str(core), *(str(plugin) for plugin in sorted((core / "plugins").iterdir()) if (plugin / "pyproject.toml").is_file())]


def failed_plugins(stderr: str) -> list[str]:
    """The plugins a run could not import (their backends were missing from it)."""
    return sorted(set(re.findall(r"warning: plugin (\S+): import failed", stderr)))


def run(model: Path, state: Path, core: Path | None, extra: list[str], log: Path | None = None) -> dict:
    """One `collage optimize` with its cost database, cache and output under ``state``; its
    results.json with the process's wall time and the plugins it could not import, or the error. With
    ``log``, its progress log is kept there."""
    state.mkdir(parents=True, exist_ok=True)  # also the working directory: `python -m` puts it first on the path
    env = dict(os.environ, COLLAGE_CACHE_DIR=str(state / "cache"))
    if core is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [*code_path(core), env.get("PYTHONPATH")]))
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "collage_core",
            "optimize",
            str(model),
            "--cost-db",
            str(state / "costs.sqlite"),
            "--output",
            str(state / "out"),
            *extra,
        ],
        env=env,
        cwd=state,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wall_s = time.perf_counter() - started
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(done.stderr)
    failed = failed_plugins(done.stderr)
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return {"error": lines[-1] if lines else f"exit code {done.returncode}", "wall_s": wall_s, "failed_plugins": failed}
    result = json.loads((state / "out" / "results.json").read_text())
    result.update(wall_s=wall_s, failed_plugins=failed)
    return result


def placement_ms(result: dict) -> str:
    for entry in result.get("end_to_end", []):
        if entry["name"] == "placement" and entry["cost"].get("kind") == "measured":
            return f"{entry['cost']['median_s'] * 1e3:.3f}"
    return "-"


def in_turns(libraries: dict[str, Path], model: Path) -> dict[str, float]:
    """The libraries timed in turns in fresh workers (the contest's protocol), warm median ms by name."""
    from collage_core import tvm_compat
    from collage_core.measure.in_turns import time_in_turns
    from collage_core.model.model_import import load_model

    with tempfile.TemporaryDirectory() as tmp:
        inputs = Path(tmp) / "inputs.npz"
        np.savez(inputs, *load_model(str(model)).random_inputs())
        costs = time_in_turns(libraries, inputs, tvm_compat.target_to_json(tvm_compat.host_cpu_target()), [], [])
    return {name: turns.warm.seconds * 1e3 for name, turns in costs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="quickstart", help="quickstart, bert-base, gpt2, resnet50, ... (comma-separated)")
    parser.add_argument("--batches", default="1")
    parser.add_argument("--before", metavar="REF", help="also run the Collage core at this git revision")
    parser.add_argument("--extra", default="", help="more `collage optimize` arguments, as one string")
    parser.add_argument("--logs", type=Path, help="keep each run's progress log in this directory")
    args = parser.parse_args()
    extra = args.extra.split()
    rows, turns = [], []
    with tempfile.TemporaryDirectory(prefix="collage-search-speed-") as tmp:
        tmp_path = Path(tmp)
        variants = {"after": None}
        if args.before:
            variants = {"before": worktree(args.before, tmp_path), "after": None}
        try:
            for name in args.models.split(","):
                for batch in (int(b) for b in args.batches.split(",")):
                    model = model_file(name, batch)
                    label = name if name == "quickstart" else f"{name} b{batch}"
                    states = {variant: tmp_path / f"{label}-{variant}".replace(" ", "-") for variant in variants}
                    for temperature in ("cold", "warm"):
                        for variant, core in variants.items():
                            print(f"{label}: {variant}, {temperature} ...", file=sys.stderr, flush=True)
                            log = args.logs / f"{label}-{variant}-{temperature}.log".replace(" ", "-") if args.logs else None
                            result = run(model, states[variant], core, extra, log)
                            rows.append((label, variant, temperature, result))
                            shown = result.get("error") or ", ".join(
                                f"{SHORT.get(p, p)} {s:.1f}" for p, s in result.get("phases_s", {}).items()
                            )
                            print(f"  {result['wall_s']:.1f} s: {shown}", file=sys.stderr, flush=True)
                    libraries = {v: s / "out" / f"{model.stem}.so" for v, s in states.items()}
                    if all(path.exists() for path in libraries.values()):
                        turns.append((label, in_turns(libraries, model)))
        finally:
            if args.before:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(variants["before"])],
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
    print_table(rows, turns, args.before)


def print_table(rows, turns, before_ref) -> None:
    heads = ["model", "variant", "run", "wall s", *(SHORT[p] for p in PHASES), "placement ms"]
    lines = []
    for label, variant, temperature, result in rows:
        if "error" in result:
            lines.append([label, variant, temperature, f"{result['wall_s']:.1f}", f"error: {result['error'][:80]}"])
            continue
        phases = result.get("phases_s", {})
        lines.append(
            [
                label,
                variant,
                temperature,
                f"{result['wall_s']:.1f}",
                *(f"{phases[p]:.1f}" if p in phases else "-" for p in PHASES),
                placement_ms(result),
            ]
        )
    widths = [max(len(str(row[i])) for row in [heads, *lines] if i < len(row)) for i in range(len(heads))]
    print()
    if before_ref:
        print(f"before: the Collage core and plugins at {before_ref}; after: this checkout")
    print("  ".join(h.ljust(w) if i < 3 else h.rjust(w) for i, (h, w) in enumerate(zip(heads, widths))))
    for row in lines:
        print("  ".join(str(c).ljust(w) if i < 3 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    missing = sorted(
        {(label, variant, ", ".join(result["failed_plugins"])) for label, variant, _, result in rows if result.get("failed_plugins")}
    )
    for label, variant, plugins in missing:
        print(f"  {label} {variant}: ran without the plugins it could not import: {plugins}")
    if turns:
        print("\nthe returned libraries timed in turns, median ms:")
        for label, costs in turns:
            print(f"  {label}: " + ", ".join(f"{variant} {ms:.3f}" for variant, ms in costs.items()))


if __name__ == "__main__":
    main()
