"""The map of the code stays complete: every module of the packages and every script is named, by its path from
the repository root, in the README's "Map of the code" or in docs/design.md's list of files, and every path that
docs/design.md names exists."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ["core", "data", "model", "experiment", "training", "evaluation", "reports", "scripts"]
_PATH = re.compile(r"`([\w./-]+/[\w.-]+\.py)`")


def modules(root: Path = REPO) -> list[str]:
    """Every .py file under the packages (their subpackages too: data/tasks/, model/pe/) and scripts/."""
    found = [path for package in PACKAGES for path in (root / package).rglob("*.py")]
    return sorted(str(path.relative_to(root)) for path in found if "__pycache__" not in path.parts)


def readme_map(root: Path = REPO) -> str:
    """The README's "## Map of the code" section, to the next heading of its level."""
    text = (root / "README.md").read_text()
    return text.split("\n## Map of the code\n", 1)[1].split("\n## ", 1)[0]


def unnamed(root: Path = REPO) -> list[str]:
    """Modules whose path is in neither the README's map nor docs/design.md. The map writes each package once and
    its files after it (`evaluation/   run.py, ...`), so a path counts there when its file name is on a line of
    its package's block; docs/design.md names each file by its whole path."""
    design = (root / "docs" / "design.md").read_text()
    blocks = _package_blocks(readme_map(root))
    missing = []
    for module in modules(root):
        if f"`{module}`" in design:
            continue
        folder, _, name = module.rpartition("/")
        if not re.search(rf"(?<![\w/]){re.escape(name)}\b", blocks.get(folder, "")):
            missing.append(module)
    return missing


def _package_blocks(section: str) -> dict[str, str]:
    """The map's text by package: a line `pkg/: ...` or `pkg/   ...` starts a package's text; a subpackage is
    written `sub/: ...` inside its package's text (`data/: ...; tasks/: base.py, ...`)."""
    blocks: dict[str, str] = {}
    current = None
    for line in section.splitlines():
        body = line.strip(" │")
        head = re.match(r"(\w+)/:?\s", body)
        if head and head.group(1) in PACKAGES:
            current = head.group(1)
        if current is not None:
            for part in re.split(r";\s*", body):
                sub = re.match(r"(\w+)/:", part)
                key = current if sub is None or sub.group(1) == current else f"{current}/{sub.group(1)}"
                blocks[key] = blocks.get(key, "") + " " + part
    return blocks


def stale(root: Path = REPO) -> list[str]:
    """Paths of .py files that docs/design.md names and that do not exist."""
    design = (root / "docs" / "design.md").read_text()
    return sorted({path for path in _PATH.findall(design) if not (root / path).exists()})


def test_the_modules_are_found():
    found = modules()
    assert {"evaluation/task_accuracy.py", "model/pe/rope.py", "data/tasks/passkey.py", "scripts/compare.py"} <= set(
        found
    )
    assert len(found) > 80


def test_every_module_is_named_in_the_map_or_in_design():
    assert unnamed() == []


def test_every_path_design_names_exists():
    assert stale() == []


def test_an_unnamed_module_and_a_stale_path_are_caught(tmp_path):
    for module in [
        "core/errors.py",
        "evaluation/run.py",
        "evaluation/task_accuracy.py",
        "data/tasks/base.py",
        "x/y.py",
    ]:
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text("`core/errors.py` and `core/gone.py`\n")
    (tmp_path / "README.md").write_text(
        "# Title\n\n## Map of the code\n\n```\nevaluation/   run.py (eval)\ndata/: tokens.py; tasks/: base.py\n"
        "core/   tasks.py\n```\n\n## Next\n\nevaluation/ tasks.py\n"
    )
    assert unnamed(tmp_path) == ["evaluation/task_accuracy.py"]
    assert stale(tmp_path) == ["core/gone.py"]
