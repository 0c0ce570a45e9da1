"""Imports run one way, down the layers the data flows through (README, "Map of the code"; docs/design.md):

    core  <  data, model  <  experiment  <  evaluation  <  training, reports  <  train.py, eval.py, sample.py, scripts/

A module may import its own package and the packages of lower layers, nothing above or beside it; so there
is no cycle between packages. Imports inside functions and under TYPE_CHECKING count too. model/ runs
without Hydra, and the packages import matplotlib only where they draw.
"""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = {"core": 0, "data": 1, "model": 1, "experiment": 2, "evaluation": 3, "training": 4, "reports": 4}
TOP = 5  # the commands: every top-level *.py (train.py, eval.py, sample.py) and scripts/*.py


def imported_modules(path: Path, when_imported: bool = False) -> set[str]:
    """Every module ``path`` imports, or with ``when_imported`` only what importing it imports: its top-level
    imports, not those in functions or under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in tree.body if when_imported else ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def sources() -> list[tuple[Path, int]]:
    found = [(path, LAYERS[package]) for package in LAYERS for path in sorted((REPO / package).rglob("*.py"))]
    commands = [*sorted(REPO.glob("*.py")), *sorted((REPO / "scripts").glob("*.py"))]  # train.py, eval.py, sample.py
    return found + [(path, TOP) for path in commands]


def layer_violations(path: Path, layer: int, root: Path = REPO) -> list[str]:
    own = path.relative_to(root).parts[0]
    bad = []
    for name in sorted(imported_modules(path)):
        package = name.split(".")[0]
        if package in LAYERS and package != own and LAYERS[package] >= layer:
            bad.append(f"{path.relative_to(root)} imports {name}")
    return bad


def test_every_package_is_checked():
    on_disk = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests"}
    assert on_disk == set(LAYERS), "add the new package to LAYERS (and to the README's map and docs/design.md)"


@pytest.mark.parametrize(
    "path, layer", sources(), ids=lambda value: str(value.relative_to(REPO)) if isinstance(value, Path) else None
)
def test_imports_go_down_the_layers(path, layer):
    assert layer_violations(path, layer) == []


def test_model_runs_without_hydra():
    for path in (REPO / "model").rglob("*.py"):
        assert not {name.split(".")[0] for name in imported_modules(path)} & {"hydra", "omegaconf"}, path


def test_the_check_catches_an_upward_import(tmp_path):
    module = tmp_path / "core" / "bad.py"
    module.parent.mkdir()
    module.write_text("import torch\nfrom core.errors import PosGPTError\n\ndef f():\n    from model.gpt import GPT\n")
    assert layer_violations(module, LAYERS["core"], root=tmp_path) == ["core/bad.py imports model.gpt"]
    data_module = tmp_path / "data" / "bad.py"
    data_module.parent.mkdir()
    data_module.write_text("import model\n")  # beside, not below: data and model share a layer
    assert layer_violations(data_module, LAYERS["data"], root=tmp_path) == ["data/bad.py imports model"]


def test_matplotlib_is_imported_only_to_draw():
    """matplotlib costs about half a second a process: the packages import it where they draw (plots.new_figure),
    so that a command refused before it draws anything, or one that never draws, does not pay for it."""
    eager = [
        str(path.relative_to(REPO))
        for path, layer in sources()
        if layer < TOP
        and any(name.split(".")[0] == "matplotlib" for name in imported_modules(path, when_imported=True))
    ]
    assert eager == []
