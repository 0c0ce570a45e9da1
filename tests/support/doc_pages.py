"""The pages the docs checks read (the README, docs/ and the results' READMEs) and the relative links in each."""

import re
from pathlib import Path

from repo_root import REPO

PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "results").glob("**/README.md")])
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_CODE_SPAN = re.compile(r"`[^`]*`")


def outside_code_blocks(text: str) -> list[str]:
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def links(page: Path) -> list[str]:
    """Link targets outside code (a link in a code block or span is not a link)."""
    lines = outside_code_blocks(page.read_text())
    return [target for line in lines for target in _LINK.findall(_CODE_SPAN.sub("", line))]
