"""The commands and Python snippets of the README and the docs pages, as a new user runs them.

The default suite checks that every ``collage`` command line in README.md and docs/*.md parses and that
every Python snippet compiles and imports what it names; ``--run-slow`` runs the README's quickstart and
Python snippet, then the pictures and the export of docs/outputs.md, in order, as written, in a folder
holding a copy of models/ (the first screen's set-up and test commands are what CI runs; the benchmark,
GPU and precision commands take hours, a GPU or a model file of the reader's own, and are left to their
own tests).
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
PAGES = (README, *sorted((ROOT / "docs").glob("*.md")))
FENCED = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
# (page, section) whose blocks run as written on this CPU, in this order: each uses what the one before wrote.
RUN_AS_WRITTEN = (
    ("README.md", "Quickstart"),
    ("README.md", "Python"),
    ("docs/outputs.md", "Seeing a placement"),
    ("docs/outputs.md", "Shipping a placement"),
)


def sections(page: Path) -> list[tuple[str, str]]:
    """(heading, text) for each part of a page: the part before the first ``## `` heading is called
    "Quickstart" in the README (its first screen) and "Top" in the other pages."""
    parts = re.split(r"^## (.+)$", page.read_text(), flags=re.MULTILINE)
    return [("Quickstart" if page == README else "Top", parts[0])] + list(zip(parts[1::2], parts[2::2]))


def blocks(language: str, only: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, str, str]]:
    """(page, heading, code) of every fenced block in ``language``, in page order; ``only`` keeps the
    (page, heading) pairs it names, in its own order."""
    found = [
        (str(page.relative_to(ROOT)), heading, code)
        for page in PAGES
        for heading, text in sections(page)
        for found_language, code in FENCED.findall(text)
        if found_language == language
    ]
    if not only:
        return found
    return [block for place in only for block in found if block[:2] == place]


def command_lines(code: str) -> list[str]:
    """The shell commands of a bash block, each without its trailing comment."""
    lines = []
    for line in code.splitlines():
        command = line.split(" #", 1)[0].strip()
        if command and not command.startswith("#"):
            lines.append(command)
    return lines


def collage_commands() -> list[list[str]]:
    return [shlex.split(line)[1:] for _, _, code in blocks("bash") for line in command_lines(code) if line.startswith("collage ")]


def test_the_pages_have_commands_and_snippets_to_check():
    assert len(collage_commands()) >= 8
    assert {place[:2] for place in blocks("python", RUN_AS_WRITTEN)} == {
        ("README.md", "Python"),
        ("docs/outputs.md", "Shipping a placement"),
    }
    assert {place[:2] for place in blocks("bash", RUN_AS_WRITTEN)} == set(RUN_AS_WRITTEN) - {("README.md", "Python")}


def test_the_readme_opens_with_set_up_test_and_the_quickstart():
    first_screen = dict(sections(README))["Quickstart"]
    set_up, quickstart = [code for language, code in FENCED.findall(first_screen) if language == "bash"]
    assert [line.split()[:2] for line in command_lines(set_up)] == [["./scripts/setup.sh"], ["python3", "-m"]]
    assert "collage optimize models/tiny_resnet.onnx" in command_lines(quickstart)
    quickstart_ends = first_screen.index(quickstart) + len(quickstart)
    assert first_screen[:quickstart_ends].count("\n") < 30, "the set-up, test and quickstart commands fit one screen"


@pytest.mark.parametrize("argv", collage_commands(), ids=" ".join)
def test_every_collage_command_in_the_pages_parses(argv):
    parsed = cli._parser().parse_args(argv)
    assert callable(parsed.command)


@pytest.mark.parametrize("page, heading, code", blocks("python"), ids=lambda value: value if len(value) < 40 else "code")
def test_every_python_snippet_compiles_and_its_imports_exist(page, heading, code):
    tree = ast.parse(code, filename=f"{page} ({heading})")
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert imports, f"the snippet under {heading!r} in {page} imports nothing: it cannot run as written"
    exec(compile(ast.Module(body=imports, type_ignores=[]), page, "exec"), {})


def _run_block(language: str, code: str, cwd: Path) -> None:
    if language == "bash":
        for line in command_lines(code):
            done = subprocess.run(line, shell=True, cwd=cwd, capture_output=True, text=True, timeout=1800)
            assert done.returncode == 0, f"{line!r} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    else:
        done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, f"the snippet failed:\n{code}\n{done.stderr[-3000:]}"


@pytest.mark.slow
def test_the_pages_run_as_written_in_order(tmp_path):
    """The README's quickstart and Python snippet, then docs/outputs.md's pictures and export, each block as
    written, in a fresh folder with models/."""
    shutil.copytree(ROOT / "models", tmp_path / "models")
    ran = []
    for page, heading in RUN_AS_WRITTEN:
        text = dict(sections(ROOT / page))[heading]
        for language, code in FENCED.findall(text):
            if language == "bash" and code.lstrip().startswith("./scripts/setup.sh"):
                continue  # the first screen's set-up and test commands: what CI runs
            _run_block(language, code, tmp_path)
            ran.append((page, heading))
    assert set(ran) == set(RUN_AS_WRITTEN), ran


GPU_MARK = re.compile(r"^(@pytest\.mark\.gpu|pytestmark = pytest\.mark\.gpu)", re.MULTILINE)


def test_the_gpu_script_runs_every_file_of_gpu_tests():
    """scripts/gpu-tests.sh, which the README and docs/usage.md give for the GPU tests, names each test file that holds a
    test marked ``gpu``, or, for a plugin's, that plugin's tests folder."""
    words = set(shlex.split((ROOT / "scripts" / "gpu-tests.sh").read_text(), comments=True))
    marked = [
        path for path in [*ROOT.glob("tests/test_*.py"), *ROOT.glob("plugins/*/tests/test_*.py")] if GPU_MARK.search(path.read_text())
    ]
    assert len(marked) >= 10
    missing = [
        str(path.relative_to(ROOT))
        for path in marked
        if not {str(path.relative_to(ROOT)), str(path.parent.relative_to(ROOT))} & words - {"tests"}
    ]
    assert not missing, f"scripts/gpu-tests.sh does not run {missing}"
