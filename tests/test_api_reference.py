"""docs/plugins.md's "API reference" against the kit: every public name of ``collage_core.kit`` and
``collage_core.kit.testing``, each with the signature the code declares, and nothing else."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from signatures import documented_signature

DOCS = Path(__file__).resolve().parent.parent / "docs" / "plugins.md"
MODULES = ("collage_core.kit", "collage_core.kit.testing")
MODULE_HEADING = re.compile(r"^### `([\w.]+)`\s*$")
# "- `name(signature) -> returned`: what it does", or "- `name`" alone (a module, a constant, an exception, a fixture)
ENTRY = re.compile(r"^- `(\w+)([^`]*)`")


def reference_section(text: str) -> str:
    start = text.index("\n## API reference\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def reference_entries(text: str) -> dict[str, list[tuple[str, str]]]:
    """Per module heading of the reference, its entries in order: (name, signature or "")."""
    entries: dict[str, list[tuple[str, str]]] = {}
    module = None
    for line in reference_section(text).splitlines():
        heading = MODULE_HEADING.match(line)
        if heading:
            module = entries.setdefault(heading.group(1), [])
        elif (entry := ENTRY.match(line)) and module is not None:
            module.append((entry.group(1), entry.group(2)))
    return entries


def reference_problems(text: str) -> list[str]:
    """What the reference in ``text`` gets wrong about the kit, one line each: none when it is right."""
    entries = reference_entries(text)
    problems = [f"the reference has a heading for {name}, which is not a kit module" for name in entries if name not in MODULES]
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        documented = entries.get(module_name, [])
        names = [name for name, _ in documented]
        problems += [f"{module_name}.{name} is not in the reference" for name in module.__all__ if name not in names]
        problems += [f"{module_name}.{name} is listed twice" for name in sorted(set(names)) if names.count(name) > 1]
        for name, signature in documented:
            if name not in module.__all__:
                problems.append(f"{module_name}.{name} is in the reference but not in the module")
                continue
            actual = documented_signature(getattr(module, name)) or ""
            if signature.removesuffix(" (module)") != actual:
                problems.append(f"{module_name}.{name}: the reference says `{name}{signature}`, the code `{name}{actual}`")
    return problems


def test_the_reference_lists_every_name_of_the_kit_with_its_signature():
    assert reference_problems(DOCS.read_text()) == []


def test_the_reference_has_an_entry_per_name_under_each_module():
    entries = reference_entries(DOCS.read_text())
    assert set(entries) == set(MODULES)
    assert all(len(entries[name]) == len(importlib.import_module(name).__all__) for name in MODULES)


def one_entry_changed(old: str, new: str) -> str:
    text = DOCS.read_text()
    assert text.count(old) == 1, old
    return text.replace(old, new)


@pytest.mark.parametrize(
    "old, new, problem",
    [
        (
            "- `pattern_of(func: relax.Function) -> str`",
            "- `pattern_of(func: relax.Function, name: str) -> str`",
            "collage_core.kit.pattern_of: the reference says `pattern_of(func: relax.Function, name: str) -> str`, "
            "the code `pattern_of(func: relax.Function) -> str`",
        ),
        (
            "- `pattern_of(func: relax.Function) -> str`",
            "- `pattern_of`",
            "collage_core.kit.pattern_of: the reference says `pattern_of`, the code `pattern_of(func: relax.Function) -> str`",
        ),
        (
            "- `pattern_of(func: relax.Function) -> str`",
            "- `pattern_named(func: relax.Function) -> str`",
            "collage_core.kit.pattern_named is in the reference but not in the module",
        ),
    ],
)
def test_a_wrong_or_unknown_entry_is_a_problem(old, new, problem):
    assert problem in reference_problems(one_entry_changed(old, new))


def test_a_missing_entry_is_a_problem():
    text = DOCS.read_text()
    without = re.sub(r"^- `run_on_cpu\(.*\n(  .*\n)*", "", text, flags=re.MULTILINE)
    assert without != text
    assert reference_problems(without) == ["collage_core.kit.testing.run_on_cpu is not in the reference"]
