"""The code is as ruff's lint and format configuration in pyproject.toml says: a finding or an unformatted file
fails here with ruff's own lines, which `ruff check --fix .` and `ruff format .` mend."""

from __future__ import annotations

import ast
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def ruff(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("ruff") is None:
        pytest.fail("ruff is not installed: ./scripts/setup.sh installs it with the test tools")
    return subprocess.run(["ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_ruff_finds_nothing():
    run = ruff("check", "--no-cache", "--output-format", "concise", ".")
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_file_is_formatted():
    run = ruff("format", "--no-cache", "--check", ".")
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_files_left_unformatted_keep_their_import_order_too_and_exist():
    """The formatter leaves the files whose bytes are part of a backend's version; the linter must not sort their
    imports either, and every one named must exist (a renamed file would be formatted without anyone noticing)."""
    ruff_config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    left = ruff_config["format"]["exclude"]
    assert sorted(left) == sorted(ruff_config["lint"]["per-file-ignores"])
    assert [path for path in left if not (ROOT / path).is_file()] == []


def test_the_files_left_unformatted_are_those_the_plugins_digest():
    """Each plugin's hooks.py passes the modules whose bytes version its backend to sources_digest (as
    ``module.__file__``); each of those files is left unformatted. Read from the hooks' source: no plugin imported."""
    from collage_core import kit

    digested = set()
    for hooks in sorted((ROOT / "plugins").glob("*/collage_*/hooks.py")):
        tree = ast.parse(hooks.read_text())
        origin = {
            alias.asname or alias.name: node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names
        }
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "sources_digest"):
                continue
            looped = {  # `Path(module.__file__) for module in (kernels, specs, ...)`: the modules looped over
                generator.target.id: [element.id for element in generator.iter.elts]
                for generator in ast.walk(call)
                if isinstance(generator, ast.comprehension) and isinstance(generator.iter, ast.Tuple)
            }
            files = [
                node.value.id
                for node in ast.walk(call)
                if isinstance(node, ast.Attribute) and node.attr == "__file__" and isinstance(node.value, ast.Name)
            ]
            for name in (module for name in files for module in looped.get(name, [name])):
                if origin.get(name) == "collage_core.kit":
                    digested.add(kit._EXPORTS[name].replace(".", "/") + ".py")
                else:
                    digested.add(str((hooks.parent / f"{name}.py").relative_to(ROOT)))
    left = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["format"]["exclude"])
    assert len(digested) > 5 and digested == left
