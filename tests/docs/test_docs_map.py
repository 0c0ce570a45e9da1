"""The map of the code stays complete without a hand copy: docs/design.md's list of modules is generated from the
code (scripts/rebuild_reports.py's module_map, between its ``<!-- table: modules -->`` markers) and must be up to
date, and every path docs/design.md's prose names exists."""

import re
import sys
from pathlib import Path

from repo_root import REPO

sys.path.insert(0, str(REPO / "scripts"))

import rebuild_reports  # noqa: E402

DESIGN = REPO / "docs" / "design.md"
_PATH = re.compile(r"`([\w./-]+/[\w.-]+\.py)`")


def stale(root: Path = REPO) -> list[str]:
    """Paths of .py files that docs/design.md names and that do not exist."""
    design = (root / "docs" / "design.md").read_text()
    return sorted({path for path in _PATH.findall(design) if not (root / path).exists()})


def test_the_map_of_the_modules_is_generated_and_up_to_date():
    """Regenerate it with python scripts/rebuild_reports.py --docs-only docs/design.md."""
    text, changed = rebuild_reports.rebuilt_doc(DESIGN)
    assert "<!-- table: modules -->" in text
    assert changed == [], (
        "docs/design.md's map of the modules is stale: run "
        + test_the_map_of_the_modules_is_generated_and_up_to_date.__doc__
    )


def test_the_map_names_every_module_by_its_docstring(tmp_path):
    for package in rebuild_reports.PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "core" / "errors.py").write_text('"""One-line errors. And more.\n\nDetail."""\n')
    (tmp_path / "data" / "tasks").mkdir()
    (tmp_path / "data" / "tasks" / "base.py").write_text('"""What a task is: a | b, e.g. this."""\n')
    table = rebuild_reports.module_map(tmp_path).splitlines()
    assert table[2:] == [
        "| `core/errors.py` | One-line errors. |",
        "| `data/tasks/base.py` | What a task is: a \\| b, e.g. this. |",
    ]


def test_every_path_design_names_exists():
    assert stale() == []


def test_a_stale_path_is_caught(tmp_path):
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "errors.py").write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text("`core/errors.py` and `core/gone.py`\n")
    assert stale(tmp_path) == ["core/gone.py"]
