"""docs/usage.md against the ``collage`` command: every command and every option has its mention, and every
option the page names exists."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from collage_core import cli

PAGE = Path(__file__).resolve().parent.parent / "docs" / "usage.md"


def commands() -> dict[str, argparse.ArgumentParser]:
    subparsers = next(action for action in cli._parser()._actions if isinstance(action, argparse._SubParsersAction))
    return dict(subparsers.choices)


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings if flag not in ("-h", "--help")}


def commands_section() -> str:
    text = PAGE.read_text()
    start = text.index("## The commands\n")
    return text[start : text.index("\n## ", start + 1)]


def command_items() -> dict[str, str]:
    """Each command's item of the list, with the lines before the list (the options every command shares)."""
    section = commands_section()
    shared = section[: section.index("\n- ")]
    items = re.findall(r"^- `collage (\w+)(.*?)(?=^- |^\S|\Z)", section, re.MULTILINE | re.DOTALL)
    return {command: shared + text for command, text in items}


def test_every_command_has_an_item_and_every_item_a_command():
    assert sorted(command_items()) == sorted(commands())


@pytest.mark.parametrize("command", sorted(commands()))
def test_every_option_of_a_command_is_in_its_item(command):
    item = command_items().get(command, "")
    flags = {flag for flag in options(commands()[command]) if flag.startswith("--")}
    assert sorted(flag for flag in flags if not re.search(rf"`[^`]*{re.escape(flag)}(?![\w-])", item)) == []


def test_every_option_the_page_names_exists():
    known = set().union(*(options(parser) for parser in commands().values())) | {"--help"}
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", commands_section()))
    assert sorted(named - known) == []
