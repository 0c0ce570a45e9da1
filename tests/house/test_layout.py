"""The tests are laid out by package (docs/testing.md, "Layout"), read from the tree, not from a list: a module's
unit tests are tests/<package>/test_<module>.py (tests/model/pe/test_rope.py for model/pe/rope.py, and
test_<module>_<aspect>.py where one module has several: tests/model/pe/test_rope_remap_string.py), a package's own
__init__.py is tests/<package>/test_<package>.py, a top-level command's tests/test_<command>.py; the commands'
end-to-end refusals are in tests/commands/, the docs checks in tests/docs/, the house rules in tests/house/, and what
the tests share (no tests) in tests/support/. Every other folder under tests/ mirrors a folder of the code."""

from __future__ import annotations

import ast
from pathlib import Path

from repo_root import REPO

# Folders named by what they hold, not by a module: any test file name goes there.
BEHAVIOUR_FOLDERS = ("commands", "docs", "house")
SUPPORT = "support"  # helpers and reference data: imported by the tests, holds none


def _modules(folder: Path) -> set[str]:
    """The names a test file in the mirror of ``folder`` may take: its modules' and, for a package, its own."""
    names = {path.stem for path in folder.glob("*.py") if path.stem != "__init__"}
    if (folder / "__init__.py").exists():
        names.add(folder.name)
    return names


def _tests_a_module(stem: str, modules: set[str]) -> bool:
    name = stem.removeprefix("test_")
    return any(name == module or name.startswith(module + "_") for module in modules)


def layout_problems(tests: Path, repo: Path) -> list[str]:
    """Every way ``tests`` departs from the layout, one line each (empty when it holds)."""
    problems = []
    for folder in sorted(path for path in [tests, *tests.rglob("*")] if path.is_dir()):
        rel = folder.relative_to(tests)
        if any(part.startswith((".", "__")) for part in rel.parts):
            continue  # __pycache__, .pytest_cache
        top = rel.parts[0] if rel.parts else ""
        files = sorted(folder.glob("*.py"))
        if top == SUPPORT:
            tests_here = [path for path in files if _is_test(path)]
            problems += [f"{path.relative_to(tests)}: tests/support/ holds no tests" for path in tests_here]
            continue
        if top in BEHAVIOUR_FOLDERS:
            if len(rel.parts) > 1:
                problems.append(f"{rel}/: tests/{top}/ has no subfolders")
            others = [path for path in files if not _is_test_or_conftest(path)]
            problems += [f"{path.relative_to(tests)}: not a test file" for path in others]
            continue
        code = repo / rel
        if rel.parts and not (code.is_dir() and any(code.glob("*.py"))):
            problems.append(f"{rel}/: mirrors no folder of the code ({rel}/ holds no module)")
            continue
        modules = {path.stem for path in repo.glob("*.py")} if not rel.parts else _modules(code)
        for path in files:
            if not _is_test_or_conftest(path):
                problems.append(f"{path.relative_to(tests)}: a support module belongs in tests/support/")
            elif _is_test(path) and not _tests_a_module(path.stem, modules):
                where = "top-level command" if not rel.parts else f"module of {rel}/"
                problems.append(f"{path.relative_to(tests)}: names no {where} (test_<module>.py)")
    return problems


def _is_test(path: Path) -> bool:
    return path.name.startswith("test_")


def _is_test_or_conftest(path: Path) -> bool:
    return _is_test(path) or path.name == "conftest.py"


def test_the_tests_are_laid_out_by_package():
    assert layout_problems(REPO / "tests", REPO) == []


def test_no_test_file_imports_another():
    """What two test files share lives in tests/support/: a test file imported by another would run its tests' module
    fixtures twice, and under --import-mode=importlib it is not importable by name at all."""
    imports = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            imports += [f"{path.relative_to(REPO)}: {name}" for name in names if name.split(".")[0].startswith("test_")]
    assert imports == []


def test_a_file_outside_the_layout_is_caught(tmp_path):
    repo = tmp_path / "repo"
    for module in ("train.py", "model/__init__.py", "model/gpt.py", "model/pe/__init__.py", "model/pe/rope.py"):
        (repo / module).parent.mkdir(parents=True, exist_ok=True)
        (repo / module).write_text("")
    tests = repo / "tests"
    fine = [
        "conftest.py",
        "test_train.py",
        "model/test_gpt.py",
        "model/test_model.py",
        "model/pe/test_rope.py",
        "model/pe/test_rope_scaled.py",
        "model/pe/test_pe.py",
        "commands/test_refusals_of_every_command.py",
        "docs/test_links.py",
        "support/cli_runs.py",
        "support/reference/make_numbers.py",
    ]
    for name in fine:
        (tests / name).parent.mkdir(parents=True, exist_ok=True)
        (tests / name).write_text("")
    assert layout_problems(tests, repo) == []
    wrong = {
        "test_foo.py": "test_foo.py: names no top-level command",
        "model/test_nonexistent.py": "model/test_nonexistent.py: names no module of model/",
        "model/pe/test_gpt.py": "model/pe/test_gpt.py: names no module of model/pe/",
        "model/helpers.py": "model/helpers.py: a support module belongs in tests/support/",
        "reference/numbers.json": "reference/: mirrors no folder of the code",
        "support/test_helpers.py": "support/test_helpers.py: tests/support/ holds no tests",
        "commands/more/test_x.py": "commands/more/: tests/commands/ has no subfolders",
    }
    for name, problem in wrong.items():
        (tests / name).parent.mkdir(parents=True, exist_ok=True)
        (tests / name).write_text("")
        found = layout_problems(tests, repo)
        assert len(found) == 1 and found[0].startswith(problem), (name, found)
        (tests / name).unlink()
        if not any((tests / name).parent.iterdir()):
            (tests / name).parent.rmdir()
