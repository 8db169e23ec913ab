"""Links between the README and the docs pages: every relative link reaches a file, and every anchor a
heading of its page, as GitHub renders them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(page: Path) -> str:
    """The page without fenced blocks and inline code, where brackets and parentheses are code, not links."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", text)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {anchor(heading) for heading in re.findall(r"^#{1,6} (.+)$", page.read_text(), re.MULTILINE)}


def local_links() -> list[tuple[str, str]]:
    return [
        (str(page.relative_to(ROOT)), target) for page in PAGES for target in LINK.findall(prose(page)) if not re.match(r"[a-z]+:", target)
    ]


def test_anchors_are_made_as_github_makes_them():
    assert anchor("The kit: what a plugin imports") == "the-kit-what-a-plugin-imports"
    assert anchor("A run of `collage optimize`") == "a-run-of-collage-optimize"
    assert anchor("Loading, and what happens when a plugin breaks") == "loading-and-what-happens-when-a-plugin-breaks"


def test_the_readme_links_every_docs_page():
    linked = {target for page, target in local_links() if page == "README.md"}
    assert sorted(f"docs/{path.name}" for path in (ROOT / "docs").glob("*.md") if f"docs/{path.name}" not in linked) == []


@pytest.mark.parametrize("page, target", local_links(), ids=lambda value: value)
def test_every_relative_link_reaches_its_file_and_heading(page, target):
    path, _, fragment = target.partition("#")
    reached = (ROOT / page).parent / path if path else ROOT / page
    assert reached.exists(), f"{page} links {target}: no {reached.relative_to(ROOT)}"
    if fragment:
        assert fragment in anchors(reached), f"{page} links {target}: {reached.name} has no such heading"
