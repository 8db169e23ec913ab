"""Converter coverage: how many of each model's operators the graph-level backends' converters take.

    python benchmarks/converter_coverage.py [--families resnet,vit,...] [--paths torchscript-onnx,torch.export]
                                            [--raw benchmarks/raw-converter-coverage] [--only-report]

The families are those of ``benchmarks/coverage.py`` (small configs, seeded random weights, built offline). Each
family-path pair is exported (the TorchScript ONNX exporter, opset 17, or ``torch.export``), imported by
``collage_core.model.model_import.load_model`` and its operator calls counted twice: as imported, and after
``collage_core.model.rewrites.for_backends``. For each count, the calls the Relax-to-ONNX converter takes (what ONNX
Runtime and OpenVINO get; ``collage_core.relax_onnx.support.refusal``) and the calls the Relax-to-PyTorch converter
takes (Inductor; ``collage_inductor.relax_to_torch.refusal``), and the refusals' reasons. Nothing is measured: a
converter's refusal is a fact of the operator, not of the machine. Each pair runs in a fresh process and lands in
``<raw>/<family>__<path>.json`` as soon as it is known, so an interrupted run resumes;
``benchmarks/CONVERTER-COVERAGE.md`` is written from the raw files.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("torchscript-onnx", "torch.export")
PAIR_TIMEOUT_S = 300
CONVERTERS = ("onnx", "inductor")


def _model_coverage():
    """benchmarks/coverage.py, loaded by path (its module name would be taken by the coverage package)."""
    spec = importlib.util.spec_from_file_location("collage_model_coverage", ROOT / "benchmarks" / "coverage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reason_group(reason: str) -> str:
    """A refusal's reason without what varies between calls of one kind: a kernel's number, lengths, values."""
    reason = re.sub(r"(call_tir of [A-Za-z_]+?)\d+\b", r"\1", reason)
    return re.sub(r"(?<![\w.])-?\d+(\.\d+)?(?![\w])", "N", reason)


def census(mod) -> dict:
    """The operator calls of ``mod``'s main, and per converter how many it takes and why it refuses the others."""
    from collage_inductor import relax_to_torch

    from collage_core import tvm_compat
    from collage_core.relax_onnx import support

    refusals = {"onnx": support.refusal, "inductor": relax_to_torch.refusal}
    calls = [binding.value for block in mod["main"].body.blocks for binding in block.bindings if tvm_compat.is_op_call(binding.value)]
    counted = {"operators": len(calls), "by_operator": dict(collections.Counter(tvm_compat.op_name(c) for c in calls))}
    for name, refusal in refusals.items():
        reasons = collections.Counter(filter(None, (refusal(call) for call in calls)))
        counted[name] = {"taken": len(calls) - sum(reasons.values()), "refused": dict(reasons)}
    callees = collections.Counter(
        tvm_compat.tir_call(c)[0].name_hint.rstrip("0123456789") for c in calls if tvm_compat.tir_call(c) is not None
    )
    counted["call_tir_callees"] = dict(callees)
    return counted


def run_pair(family: str, path: str, workdir: Path) -> dict:
    """Export and import one family through one path; its census as imported and after the rewrites."""
    import torch
    from tvm import relax

    from collage_core.model import rewrites
    from collage_core.model.model_import import load_model

    coverage = _model_coverage()
    torch.manual_seed(coverage.SEED)
    kind, builder = coverage._families()[family]
    record = {"family": family, "kind": kind, "path": path}
    module, inputs = builder()
    module = coverage.FirstTensor(module.eval())
    started = time.perf_counter()
    try:
        if path == "torch.export":
            imported = load_model(module, example_inputs=inputs, name=family)
        else:
            onnx_path = workdir / f"{family}.onnx"
            with torch.no_grad():
                torch.onnx.export(module, inputs, str(onnx_path), opset_version=17, dynamo=False)
            imported = load_model(str(onnx_path), name=family)
    except Exception as error:
        return {**record, "failed": coverage._one_line(error)}
    record["import_s"] = round(time.perf_counter() - started, 2)
    record["as_imported"] = census(imported.mod)
    rewritten = rewrites.for_backends(imported.mod)
    rewritten = relax.transform.DeadCodeElimination(["main"])(relax.transform.CanonicalizeBindings()(rewritten))
    record["rewritten"] = census(rewritten)
    return {**record, "failed": None}


def measure_all(families, paths, raw: Path) -> None:
    raw.mkdir(parents=True, exist_ok=True)
    pairs = [(family, path) for family in families for path in paths]
    for index, (family, path) in enumerate(pairs, 1):
        out = raw / f"{family}__{path}.json"
        if out.exists():
            continue
        print(f"[{index}/{len(pairs)}] {family} via {path} ...", end=" ", flush=True)
        started = time.perf_counter()
        try:
            done = subprocess.run(
                [sys.executable, __file__, "--one", family, path, "--raw", str(raw)], capture_output=True, text=True, timeout=PAIR_TIMEOUT_S
            )
            if not out.exists():
                tail = [line for line in done.stderr.splitlines() if line.strip()][-1:] or [f"exit {done.returncode}"]
                out.write_text(json.dumps({"family": family, "path": path, "failed": f"crash: {tail[0][:400]}"}))
        except subprocess.TimeoutExpired:
            out.write_text(json.dumps({"family": family, "path": path, "failed": f"no result within {PAIR_TIMEOUT_S} s"}))
        result = json.loads(out.read_text())
        print(f"{'done' if not result['failed'] else 'FAILED'} ({time.perf_counter() - started:.0f} s)", flush=True)


def _share(taken: int, total: int) -> str:
    return f"{taken}/{total} ({100 * taken / max(total, 1):.0f}%)"


def write_report(raw: Path, families, paths, command: str, report: Path) -> None:
    import platform
    from importlib.metadata import version

    cpu = (
        next(
            (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
            platform.machine(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.machine()
    )
    versions = ", ".join(f"{name} {version(name)}" for name in ("torch", "transformers", "onnx", "apache-tvm"))
    results = {}
    for file in sorted(raw.glob("*.json")):
        record = json.loads(file.read_text())
        if record["family"] in families and record["path"] in paths:
            results[(record["family"], record["path"])] = record
    done = [record for record in results.values() if not record["failed"]]
    totals = {stage: {"operators": 0, **{name: 0 for name in CONVERTERS}} for stage in ("as_imported", "rewritten")}
    reasons = {stage: {name: collections.defaultdict(lambda: [0, set()]) for name in CONVERTERS} for stage in ("as_imported", "rewritten")}
    for record in done:
        for stage, total in totals.items():
            total["operators"] += record[stage]["operators"]
            for name in CONVERTERS:
                total[name] += record[stage][name]["taken"]
                for reason, count in record[stage][name]["refused"].items():
                    group = reasons[stage][name][reason_group(reason)]
                    group[0] += count
                    group[1].add(record["family"])
    before, after = totals["as_imported"], totals["rewritten"]
    lines = [
        "# Converter coverage",
        "",
        f"Command: `{command}`. Machine: {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}; {versions}. "
        "Families of `benchmarks/coverage.py` (small configs, seeded random weights, built offline), each exported "
        "through each path and imported by `load_model`; its operator calls counted as imported and after "
        "`collage_core.model.rewrites.for_backends`, with the calls the Relax-to-ONNX converter (ONNX Runtime, OpenVINO) and "
        "the Relax-to-PyTorch converter (Inductor) take. Nothing is timed.",
        "",
        f"**{len(done)} model-path pairs, {before['operators']} operator calls as imported: the ONNX converter takes "
        f"{_share(before['onnx'], before['operators'])}, the PyTorch converter {_share(before['inductor'], before['operators'])}. "
        f"After the rewrites ({after['operators']} calls): ONNX {_share(after['onnx'], after['operators'])}, "
        f"PyTorch {_share(after['inductor'], after['operators'])}.**",
        "",
        "| family | path | calls as imported | ONNX takes | PyTorch takes | calls rewritten | ONNX takes | PyTorch takes | call_tir callees as imported |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    failures = []
    for family in families:
        for path in paths:
            record = results.get((family, path))
            if record is None:
                continue
            if record["failed"]:
                failures.append(f"- {family} via {path}: {record['failed']}")
                lines.append(f"| {family} | {path} | fails to import | | | | | | |")
                continue
            first, second = record["as_imported"], record["rewritten"]
            callees = ", ".join(f"{name} ×{count}" for name, count in sorted(first["call_tir_callees"].items())) or "none"
            lines.append(
                f"| {family} | {path} | {first['operators']} | {_share(first['onnx']['taken'], first['operators'])} | "
                f"{_share(first['inductor']['taken'], first['operators'])} | {second['operators']} | "
                f"{_share(second['onnx']['taken'], second['operators'])} | "
                f"{_share(second['inductor']['taken'], second['operators'])} | {callees} |"
            )
    tables = {}  # converter -> reason group -> (calls as imported, calls after the rewrites, families)
    for name in CONVERTERS:
        before_reasons, after_reasons = reasons["as_imported"][name], reasons["rewritten"][name]
        tables[name] = {
            reason: (
                before_reasons[reason][0],
                after_reasons[reason][0],
                ", ".join(sorted(before_reasons[reason][1] | after_reasons[reason][1])),
            )
            for reason in sorted(set(before_reasons) | set(after_reasons))
        }
    for name, label in (("onnx", "ONNX converter"), ("inductor", "PyTorch converter")):
        if name != "onnx" and tables[name] == tables["onnx"]:
            lines += [
                "",
                f"The {label} refuses the same calls for the same reasons: it refuses what the ONNX converter refuses, and nothing more.",
            ]
            continue
        lines += [
            "",
            f"The {label}'s refusals, grouped (N: a number that varies), as imported -> after the rewrites, most calls first:",
            "",
        ]
        ranked = sorted(tables[name].items(), key=lambda item: (-item[1][0], -item[1][1], item[0]))
        lines += [f"- {before} -> {after} × {reason} ({fams})" for reason, (before, after, fams) in ranked] or ["- none"]
    if failures:
        lines += ["", "Pairs that did not import:", "", *failures]
    report.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=None, help="comma-separated (default: every family of coverage.py)")
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--raw", type=Path, default=ROOT / "benchmarks" / "raw-converter-coverage")
    parser.add_argument("--report", type=Path, default=ROOT / "benchmarks" / "CONVERTER-COVERAGE.md")
    parser.add_argument("--only-report", action="store_true")
    parser.add_argument("--one", nargs=2, metavar=("FAMILY", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        import tempfile

        family, path = args.one
        with tempfile.TemporaryDirectory(prefix="collage-converter-coverage-") as workdir:
            record = run_pair(family, path, Path(workdir))
        (args.raw / f"{family}__{path}.json").write_text(json.dumps(record, indent=1) + "\n")
        return
    families = args.families.split(",") if args.families else list(_model_coverage()._families())
    paths = args.paths.split(",")
    if not args.only_report:
        measure_all(families, paths, args.raw)
    command = "python benchmarks/converter_coverage.py" + (f" --families {args.families}" if args.families else "")
    write_report(args.raw, families, paths, command, args.report)


if __name__ == "__main__":
    main()
