"""The README's commands and Python snippets, as a new user runs them.

The default suite checks that every ``collage`` command line in the README parses and that every
Python snippet compiles and imports what it names; ``--run-slow`` runs the quickstart, the Python
snippets, the pictures and the export in order, as written, in a folder holding a copy of models/
(the first screen's set-up and test commands are what CI runs; the benchmark, GPU and precision
commands take hours, a GPU or a model file of the reader's own, and are left to their own tests).
"""

from __future__ import annotations

import ast
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from collage_core import cli

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FENCED = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
# Sections whose blocks run as written on this CPU, in the README's order.
RUN_AS_WRITTEN = ("Quickstart", "Python", "Seeing a placement", "Shipping a placement")


def sections() -> list[tuple[str, str]]:
    """(heading, text) for each part of the README: the first screen is called "Quickstart"."""
    parts = re.split(r"^## (.+)$", README.read_text(), flags=re.MULTILINE)
    return [("Quickstart", parts[0])] + list(zip(parts[1::2], parts[2::2]))


def blocks(language: str, only: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    return [
        (heading, code)
        for heading, text in sections()
        if not only or heading in only
        for found_language, code in FENCED.findall(text)
        if found_language == language
    ]


def command_lines(code: str) -> list[str]:
    """The shell commands of a bash block, each without its trailing comment."""
    lines = []
    for line in code.splitlines():
        command = line.split(" #", 1)[0].strip()
        if command and not command.startswith("#"):
            lines.append(command)
    return lines


def collage_commands() -> list[list[str]]:
    return [shlex.split(line)[1:] for _, code in blocks("bash") for line in command_lines(code)
            if line.startswith("collage ")]


def test_the_readme_has_commands_and_snippets_to_check():
    assert len(collage_commands()) >= 8
    assert {heading for heading, _ in blocks("python", RUN_AS_WRITTEN)} >= {"Python", "Shipping a placement"}


@pytest.mark.parametrize("argv", collage_commands(), ids=" ".join)
def test_every_collage_command_in_the_readme_parses(argv):
    parsed = cli._parser().parse_args(argv)
    assert callable(parsed.command)


@pytest.mark.parametrize("heading, code", blocks("python"), ids=lambda value: value if len(value) < 40 else "code")
def test_every_python_snippet_compiles_and_its_imports_exist(heading, code):
    tree = ast.parse(code, filename=f"README.md ({heading})")
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert imports, f"the snippet under {heading!r} imports nothing: it cannot run as written"
    exec(compile(ast.Module(body=imports, type_ignores=[]), "README.md", "exec"), {})


def _run_block(language: str, code: str, cwd: Path) -> None:
    if language == "bash":
        for line in command_lines(code):
            done = subprocess.run(line, shell=True, cwd=cwd, capture_output=True, text=True, timeout=1800)
            assert done.returncode == 0, f"{line!r} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    else:
        done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, f"the README's snippet failed:\n{code}\n{done.stderr[-3000:]}"


@pytest.mark.slow
def test_the_readme_runs_as_written_in_order(tmp_path):
    """Quickstart, Python, pictures and export, each block as written, in a fresh folder with models/."""
    shutil.copytree(ROOT / "models", tmp_path / "models")
    ran = []
    for heading, text in sections():
        if heading not in RUN_AS_WRITTEN:
            continue
        for language, code in FENCED.findall(text):
            if language == "bash" and code.lstrip().startswith("./scripts/setup.sh"):
                continue  # the first screen's set-up and test commands: what CI runs
            _run_block(language, code, tmp_path)
            ran.append(heading)
    assert set(ran) == set(RUN_AS_WRITTEN), ran
