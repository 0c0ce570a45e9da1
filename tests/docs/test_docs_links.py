"""Every relative link in the README, the guide pages (docs/) and the results' READMEs points to a file or folder
that exists, and a link to a heading (#anchor) to a heading that exists, named as GitHub names it."""

import re
from collections import Counter
from pathlib import Path

import pytest
from doc_pages import PAGES, REPO, links, outside_code_blocks


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings: lower case, punctuation dropped, spaces as hyphens, and -1, -2, ...
    after repeats."""
    seen: Counter[str] = Counter()
    found = set()
    for line in outside_code_blocks(page.read_text()):
        heading = re.match(r"#{1,6} (.+)", line)
        if heading is None:
            continue
        title = re.sub(r"`([^`]*)`", r"\1", heading.group(1)).strip().lower()
        slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
        found.add(slug if seen[slug] == 0 else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return found


def broken(page: Path) -> list[str]:
    problems = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            problems.append(f"{target}: no such file")
        elif anchor and (destination.suffix != ".md" or anchor not in anchors(destination)):
            problems.append(f"{target}: no heading #{anchor} in {path or page.name}")
    return problems


def test_the_pages_are_found():
    names = {str(page.relative_to(REPO)) for page in PAGES}
    assert {"README.md", "docs/configuration.md", "docs/results.md", "results/README.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(REPO)) for page in PAGES])
def test_every_relative_link_resolves(page):
    assert broken(page) == []


def test_a_broken_link_and_a_missing_heading_are_caught(tmp_path):
    (tmp_path / "other.md").write_text("# A heading, with `code` & more\n\n## Repeat\n\n## Repeat\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#a-heading-with-code--more) [ok](other.md#repeat-1) ![img](missing.png)\n"
        "[bad](other.md#nothing) `[in code](nowhere.md)`\n```\n[in a block](nowhere.md)\n```\n"
    )
    assert broken(page) == ["missing.png: no such file", "other.md#nothing: no heading #nothing in other.md"]


README_LINE = 120  # characters a prose line of the README may hold, so that a newcomer reads it without scrolling


def long_prose_lines(text: str) -> list[str]:
    """Lines of prose (not code blocks, not table rows) longer than README_LINE, measured as read: a link's target
    (a path or anchor that cannot be wrapped) does not count."""
    lines = [line for line in outside_code_blocks(text) if not line.lstrip().startswith("|")]
    return [line for line in lines if len(re.sub(r"\]\([^)\s]+\)", "]()", line)) > README_LINE]


def test_no_prose_line_of_the_readme_passes_120_characters():
    assert long_prose_lines((REPO / "README.md").read_text()) == []


def test_a_long_prose_line_is_found_and_a_link_target_or_a_table_row_is_not():
    words = "word " * 30
    text = f"{words}\n| {words} |\n```\n{words}\n```\nshort [link](docs/{'x' * 200}.md)\n"
    assert long_prose_lines(text) == [words]
