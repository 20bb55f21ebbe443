"""The README stays a newcomer's page (at most about 250 lines) and every relative link in it and in docs/ resolves:
the file exists and, where the link names an anchor, the target has a heading with that GitHub anchor."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 250
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but hyphens and spaces dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {github_anchor(heading) for heading in HEADING.findall(text)}


def broken_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # http(s), mailto: not checked here
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no heading with that anchor)")
    return broken


def test_the_readme_fits_a_newcomers_reading():
    # GIVEN the README WHEN counting its lines THEN it is at most about 250, the rest living in docs/
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


@pytest.mark.parametrize(
    "page", [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))], ids=lambda p: str(p.relative_to(ROOT))
)
def test_every_relative_link_resolves(page: Path):
    # GIVEN a page of the docs WHEN following each relative link THEN its file exists and its anchor is a heading there
    assert broken_links(page) == []


def test_a_link_to_a_missing_anchor_is_reported(tmp_path: Path):
    # GIVEN a page linking to a heading that its target lacks WHEN checked THEN the link is reported
    (tmp_path / "a.md").write_text("# Title\n\n## A section\n")
    (tmp_path / "b.md").write_text("[ok](a.md#a-section) [bad](a.md#no-section) [gone](c.md)\n")
    assert broken_links(tmp_path / "b.md") == ["a.md#no-section (no heading with that anchor)", "c.md (no such file)"]
