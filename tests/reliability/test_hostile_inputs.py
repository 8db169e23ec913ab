"""Files Collage reads never crash it or run code; what it writes follows the user's umask; plugins can be allow-listed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collage_core.cli import main
from collage_core.outputs.placement_file import PlacementFileError, placement_from_json

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "collage_core", *sorted((ROOT / "plugins").glob("*/collage_*"))]

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=24,
)
VALID = {
    "format": "collage-placement",
    "version": 1,
    "model": {"name": "m", "fingerprint": "f", "operators": ["relax.nn.relu", "relax.add"], "inputs_of": [[], [0]]},
    "target": {"kind": "llvm"},
    "device": "llvm:cpu",
    "backends": {"tvm": {"version": "1", "kind": "op-level"}},
    "search": "op-level",
    "partitions": [
        {
            "backend": "tvm",
            "pattern": "tvm.op",
            "operators": [0],
            "key": "a",
            "cost": {"kind": "measured", "median_s": 1e-3, "spread_s": 0.0, "repeats": 3},
        },
        {
            "backend": "tvm",
            "pattern": "tvm.op",
            "operators": [1],
            "key": "b",
            "cost": {"kind": "measured", "median_s": 1e-3, "spread_s": 0.0, "repeats": 3},
        },
    ],
}


def _loads_or_refuses(data) -> None:
    try:
        placement_from_json(data, "fuzzed.json")
    except PlacementFileError as error:
        assert str(error).startswith("fuzzed.json: ") and "\n" not in str(error)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON)
def test_placement_loader_never_crashes_on_arbitrary_json(data):
    _loads_or_refuses(data)


def _paths(value, prefix=()):
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, prefix + (key,))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _paths(child, prefix + (index,))
    yield prefix


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_placement_loader_never_crashes_on_a_valid_file_with_one_part_replaced(data):
    document = json.loads(json.dumps(VALID))
    path = data.draw(st.sampled_from([p for p in _paths(document) if p]))
    parent = document
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = data.draw(JSON)
    _loads_or_refuses(document)


def test_no_file_collage_reads_is_unpickled_or_evaluated():
    forbidden = re.compile(
        r"\bpickle\b|(?<![.\w])eval\(|(?<![.\w])exec\(|allow_pickle\s*=\s*True|yaml\.load\(|marshal\.loads|torch\.load\("
    )
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for source in SOURCES
        for path in sorted(source.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if forbidden.search(line)
    ]
    assert not hits


def test_files_collage_writes_follow_the_umask(tmp_path):
    code = (
        "import os, sys, pathlib\n"
        "os.umask(0o077)\n"
        "from collage_core.measure.cost_db import CostDatabase\n"
        "from collage_core.build.deploy import write_runtime_file\n"
        "from collage_core.outputs.placement_file import placement_from_json\n"
        "import json\n"
        "out = pathlib.Path(sys.argv[1])\n"
        "placement_from_json(json.loads(sys.argv[2]), 'x').save(out / 'placement.json')\n"
        "CostDatabase.open(out / 'costs.sqlite').close()\n"
        "(out / 'lib.so').write_bytes(b'')\n"
        "write_runtime_file(out / 'lib.so', {})\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path), json.dumps(VALID)], check=True, timeout=120)
    written = [p for p in tmp_path.iterdir() if p.is_file()]
    assert {"placement.json", "costs.sqlite", "lib.so.runtime.json"} <= {p.name for p in written}
    assert all(p.stat().st_mode & 0o077 == 0 for p in written), {p.name: oct(p.stat().st_mode) for p in written}


def test_allow_list_loads_only_the_named_plugins():
    env = {**os.environ, "COLLAGE_PLUGINS": "tvm"}
    run = subprocess.run(["collage", "backends"], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    names = [line.split()[0] for line in run.stdout.splitlines()[2:] if line.strip()]
    assert names == ["tvm"]


def test_deny_list_leaves_out_the_named_plugins():
    env = {**os.environ, "COLLAGE_DISABLE_PLUGINS": "tvm"}
    run = subprocess.run(["collage", "backends"], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "tvm" not in [line.split()[0] for line in run.stdout.splitlines()[2:] if line.strip()]


def _replay(placement: Path) -> subprocess.CompletedProcess:
    """The ``collage`` command replaying ``placement``, run in the placement's folder (its default output goes there)."""
    return subprocess.run(
        ["collage", "optimize", str(ROOT / "models" / "tiny_resnet.onnx"), "--placement", str(placement), "--no-compare"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=placement.parent,
    )


def _placement_for_tiny_resnet() -> dict:
    from collage_core.model.model_import import load_model
    from collage_core.model.relax_graph import RelaxGraph

    graph = RelaxGraph.from_function(load_model(str(ROOT / "models" / "tiny_resnet.onnx")).mod["main"])
    document = json.loads(json.dumps(VALID))
    document["model"]["operators"] = list(graph.graph.ops)
    document["model"]["inputs_of"] = []
    cost = VALID["partitions"][0]["cost"]
    document["partitions"] = [
        {"backend": "tvm", "pattern": "tvm.op", "operators": [n], "key": f"k{n}", "cost": cost} for n in range(len(graph.graph))
    ]
    return document


def _with(document: dict, **changes) -> dict:
    changed = json.loads(json.dumps(document))
    for dotted, value in changes.items():
        target = changed
        *parents, last = dotted.split("__")
        for step in parents:
            target = target[int(step) if step.isdigit() else step]
        target[int(last) if last.isdigit() else last] = value
    return changed


def _replay_here(placement: Path, capfd) -> tuple[int, str]:
    """What ``collage optimize --placement`` returns and writes to stderr, run by ``cli.main`` in this process."""
    previous = signal.getsignal(signal.SIGTERM)  # main() installs its own handler
    try:
        code = main(["optimize", str(ROOT / "models" / "tiny_resnet.onnx"), "--placement", str(placement), "--no-compare"])
    finally:
        signal.signal(signal.SIGTERM, previous)
    return code, capfd.readouterr().err


@pytest.mark.slow
def test_bad_placement_files_end_the_run_in_one_line_naming_the_file(tmp_path, monkeypatch, capfd):
    """Each file is refused by ``cli.main`` in this process (a new ``collage`` process takes about 3 s to
    start); the last also by the ``collage`` command itself, for its exit status and whole stderr."""
    monkeypatch.chdir(tmp_path)  # main() makes its default output directory here
    document = _placement_for_tiny_resnet()
    cases = {
        "other_version.json": (
            json.dumps(_with(document, version=7)),
            "placement version 7 is not supported (this Collage reads version 1)",
        ),
        "malformed.json": ('{"format": "collage-placement", "version": 1,', "not JSON"),
        "unknown_backend.json": (
            json.dumps(_with(document, partitions__0__backend="cutlass")),
            "placed on backend(s) not among this run's (",
        ),
        "other_model.json": (
            json.dumps(_with(document, model__operators__0="relax.nn.softmax")),
            "operator 0 is relax.nn.softmax in the placement",
        ),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        runs = [_replay_here(path, capfd)]
        if name == "other_model.json":
            run = _replay(path)
            runs.append((run.returncode, run.stderr))
        for code, stderr in runs:
            errors = [line for line in stderr.splitlines() if line.startswith("collage: error:")]
            assert code == 1 and len(errors) == 1, stderr[-1000:]
            assert f"{path}: {message}" in errors[0]


def _show_here(path: Path, capfd) -> tuple[int, list[str]]:
    """What ``collage show`` returns and its error lines, run by ``cli.main`` in this process."""
    previous = signal.getsignal(signal.SIGTERM)  # main() installs its own handler
    try:
        code = main(["show", str(path)])
    finally:
        signal.signal(signal.SIGTERM, previous)
    return code, [line for line in capfd.readouterr().err.splitlines() if line.startswith("collage: error:")]


def test_placements_nested_too_deeply_or_with_numbers_past_floats_are_refused_in_one_line(tmp_path, capfd):
    cases = {
        "deep.json": ("[" * 100_000 + "]" * 100_000, "not a placement (its JSON is nested too deeply to read)"),
        "huge-operator.json": (
            json.dumps(VALID).replace('"operators": [0]', '"operators": [1e999]'),
            "partition 0's operators must be a list of non-negative integers",
        ),
        "fractional-operator.json": (
            json.dumps(VALID).replace('"operators": [0]', '"operators": [0.5]'),
            "partition 0's operators must be a list of non-negative integers",
        ),
        "text-operator.json": (
            json.dumps(VALID).replace('"operators": [0]', '"operators": ["0"]'),
            "partition 0's operators must be a list of non-negative integers",
        ),
        "text-version.json": (
            json.dumps(VALID).replace('"version": 1', '"version": "1"', 1),
            "placement version '1' is not a number (this Collage reads version 1)",
        ),
        "huge-repeats.json": (
            json.dumps(VALID).replace('"repeats": 3', '"repeats": 1e999', 1),
            "malformed placement (a field of the wrong kind: cannot convert float infinity to integer)",
        ),
        "infinite-cost.json": (
            json.dumps(VALID).replace('"median_s": 0.001', '"median_s": 1e999', 1),
            "partition 0's cost is measured as median inf s",
        ),
        "nan-cost.json": (
            json.dumps(VALID).replace('"median_s": 0.001', '"median_s": NaN', 1),
            "partition 0's cost is measured as median nan s",
        ),
        "negative-cost.json": (
            json.dumps(VALID).replace('"spread_s": 0.0', '"spread_s": -1', 1),
            "partition 0's cost is measured as median 0.001 s, spread -1.0 s",
        ),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        code, errors = _show_here(path, capfd)
        assert code == 1 and len(errors) == 1 and errors[0].startswith(f"collage: error: {path}: {message}"), (name, errors)


def test_a_folder_or_a_device_as_a_placement_is_refused_without_reading_it(tmp_path, capfd):
    for path, what in ((tmp_path, "a folder"), (Path("/dev/zero"), "not a regular file")):
        code, errors = _show_here(path, capfd)
        assert code == 1 and errors == [f"collage: error: {path}: {what}, not a placement file"]


def test_a_placement_whose_partition_is_not_its_patterns_match_is_refused_in_one_line_before_the_build(tmp_path, monkeypatch, capfd):
    """A file edited by hand (or made for another model of the same operators) may place operators by a pattern
    that does not match them, or name a pattern its backend does not have: the replay says which partition of
    which file, rather than failing in a plugin's lowering without naming the file."""
    monkeypatch.chdir(tmp_path)
    document = _placement_for_tiny_resnet()
    merged = _with(document, partitions__0__operators=[0, 1, 2, 3])  # a convolution, its bias, a ReLU and the next convolution
    merged["partitions"] = [merged["partitions"][0], *merged["partitions"][4:]]
    cases = {
        "not_a_match.json": (merged, "partition 0 (tvm, pattern tvm.op, operators 0, 1, 2, 3) is not a match of that pattern"),
        "unknown_pattern.json": (
            _with(document, partitions__0__pattern="tvm.nonexistent"),
            "partition 0 names pattern tvm.nonexistent, which is not one of backend tvm's patterns here",
        ),
    }
    for name, (placement, message) in cases.items():
        path = tmp_path / name
        path.write_text(json.dumps(placement))
        code, stderr = _replay_here(path, capfd)
        errors = [line for line in stderr.splitlines() if line.startswith("collage: error:")]
        assert code == 1 and len(errors) == 1, stderr[-1000:]
        assert errors[0].startswith(f"collage: error: {path}: {message}")
        assert "building" not in stderr


def test_a_placement_made_for_another_kind_of_target_is_replayed_with_a_warning(tmp_path, monkeypatch, capfd):
    """Its costs and choices are another target's: the replay says so (``--strict`` then fails the run)."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "cuda_placement.json"
    path.write_text(json.dumps(_with(_placement_for_tiny_resnet(), target={"kind": "cuda"})))
    code, stderr = _replay_here(path, capfd)
    assert code == 0, stderr[-1000:]
    assert f"warning: {path} was made for a cuda target and is replayed on a llvm target" in stderr
