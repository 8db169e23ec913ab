"""docs/architecture.md against the code: every package of the core has its section and its box in the
pipeline's picture, every hook its arrow and its row, and every package, module and hook the page names exists."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

from collage_core import hookspecs

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "collage_core"
PAGE = ROOT / "docs" / "architecture.md"
PACKAGE_HEADING = re.compile(r"^### `collage_core/([\w/]+)/`$", re.MULTILINE)
MODULE_FILE = re.compile(r"`([\w/]+\.py)`")


def core_packages() -> set[str]:
    """Every folder under collage_core that holds Python modules, relative to it ("kit/testing")."""
    return {str(path.parent.relative_to(CORE)) for path in CORE.rglob("*.py") if path.parent != CORE}


def hooks() -> set[str]:
    return {name for name, _ in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith(f"{hookspecs.PROJECT}_")}


def section(title: str) -> str:
    """The text under ``title`` (a ``## `` or ``### `` heading) up to the next heading of any level."""
    text = PAGE.read_text()
    start = text.index(f"{title}\n")
    following = re.search(r"^#{2,3} ", text[start + len(title) :], re.MULTILINE)
    return text[start : start + len(title) + following.start()] if following else text[start:]


def package_sections() -> dict[str, str]:
    return {package: section(f"### `collage_core/{package}/`") for package in PACKAGE_HEADING.findall(PAGE.read_text())}


def diagram() -> str:
    found = re.findall(r"^```mermaid\n(.*?)^```", PAGE.read_text(), re.MULTILINE | re.DOTALL)
    assert len(found) == 1, "docs/architecture.md should hold one mermaid block: the picture of the pipeline"
    return found[0]


def boxed_names() -> set[str]:
    """The core's packages and modules the picture's boxes name in bold, as paths ("kit/testing", "model/verify")."""
    return {name.strip().replace(".", "/") for bold in re.findall(r"<b>(.*?)</b>", diagram()) for name in bold.split(",")}


def hook_arrows() -> set[str]:
    """The hooks named on the picture's dotted arrows (``-.->|"label"|``)."""
    return {name for label in re.findall(r'-\.->\|"(.*?)"\|', diagram()) for name in re.findall(r"collage_\w+", label)}


def test_every_package_of_the_core_has_a_section_and_no_section_names_a_missing_one():
    assert core_packages() >= {"model", "candidates", "measure", "search", "build", "outputs", "kit"}
    assert set(package_sections()) == core_packages()


@pytest.mark.parametrize("package", sorted(core_packages()))
def test_every_module_a_section_names_exists_there(package):
    text = package_sections().get(package, "")
    named = MODULE_FILE.findall(text)
    assert named, f"the section of collage_core/{package}/ names none of its modules"
    missing = [name for name in named if not ((ROOT / name) if "/" in name else (CORE / package / name)).is_file()]
    assert missing == []


def test_every_module_beside_the_packages_is_named_and_every_one_named_exists():
    text = section("### Beside the packages")
    modules = {path.name for path in CORE.glob("*.py")}
    assert sorted(name for name in modules if f"`{name}`" not in text) == []
    assert sorted(set(MODULE_FILE.findall(text)) - modules) == []


def test_every_path_and_module_the_page_names_exists():
    text = PAGE.read_text()
    paths = set(re.findall(r"`((?:collage_core|plugins|tests|scripts|benchmarks)/[\w./]*)`", text))
    assert sorted(path for path in paths if not (ROOT / path).exists()) == []
    for dotted in set(re.findall(r"`(collage_core(?:\.\w+)+)`", text)):
        resolve(dotted)


def resolve(dotted: str):
    """The module or attribute a dotted name names; raises when there is none."""
    parts = dotted.split(".")
    value = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 2):
        value = getattr(value, part) if hasattr(value, part) else importlib.import_module(".".join(parts[:i]))
    return value


def test_the_picture_has_a_box_for_every_package_and_boxes_only_what_exists():
    boxed = boxed_names()
    assert sorted(core_packages() - boxed) == []
    assert sorted(name for name in boxed if not (CORE / name).is_dir() and not (CORE / f"{name}.py").is_file()) == []


def test_every_hook_has_an_arrow_in_the_picture_and_every_arrow_a_hook():
    assert hook_arrows() == hooks()


def test_every_hook_has_a_row_naming_the_modules_that_call_it():
    rows = re.findall(r"^\| `(collage_\w+)` \|[^|]*\| (.*?) \|", section("## The plugin API"), re.MULTILINE)
    assert sorted(hook for hook, _ in rows) == sorted(hooks())
    for hook, callers in rows:
        for module in re.findall(r"`([\w/]+\.py)`", callers):
            assert f"hook.{hook}" in (CORE / module).read_text(), f"collage_core/{module} does not call {hook}"
