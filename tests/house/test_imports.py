"""Imports run one way, down the layers the data flows through (README, "Map of the code"; docs/design.md):

    core  <  data, model  <  training, evaluation  <  reports  <  experiment  <  train.py, ...

(train.py, eval.py, sample.py and scripts/ are the top.) experiment/ plans what the stages below it run and hands
each its part (docs/design.md, "Config -> plan -> stages"): no stage imports it.
A module may import its own package and the packages of lower layers, nothing above or beside it; so there
is no cycle between packages. Nor between the modules of one package: no module imports one that imports it
back, directly or through others. Imports inside functions and under TYPE_CHECKING count too. model/ runs
without Hydra, and the packages import matplotlib only where they draw.
"""

import ast
from pathlib import Path

import pytest
from repo_root import REPO

LAYERS = {"core": 0, "data": 1, "model": 1, "training": 2, "evaluation": 2, "reports": 3, "experiment": 4}
MODULE_LAYERS: dict[str, int] = {}  # a module above its package's layer (the docstring says why)
TOP = 6  # the commands: every top-level *.py (train.py, eval.py, sample.py) and scripts/*.py


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
    found = [
        (path, MODULE_LAYERS.get(str(path.relative_to(REPO)), LAYERS[package]))
        for package in LAYERS
        for path in sorted((REPO / package).rglob("*.py"))
    ]
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


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph(root: Path = REPO) -> dict[str, set[str]]:
    """Every module of the packages -> the modules of the packages it imports (``from a import b`` names the
    module a.b where there is one, else a; an import of a.b.c that is not a module, its nearest module)."""
    paths = {module_name(p, root): p for package in LAYERS for p in sorted((root / package).rglob("*.py"))}

    def nearest(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text(), str(path))
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {nearest(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found |= {nearest(f"{node.module}.{alias.name}") for alias in node.names}
        graph[name] = found - {None, name}
    return graph


def module_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that reach each other through their imports (strongly connected, more than one)."""
    reach = {name: set() for name in graph}
    for start in graph:
        todo = list(graph[start])
        while todo:
            name = todo.pop()
            if name not in reach[start]:
                reach[start].add(name)
                todo += graph.get(name, ())
    groups = {frozenset({a} | {b for b in reach[a] if a in reach[b]}) for a in graph}
    return sorted(sorted(group) for group in groups if len(group) > 1)


def test_no_module_imports_one_that_imports_it_back():
    assert module_cycles(module_graph()) == []


def test_the_check_catches_a_cycle_through_a_function_level_import(tmp_path):
    (tmp_path / "evaluation").mkdir()
    (tmp_path / "evaluation" / "run.py").write_text("def f():\n    from evaluation.task_accuracy import g\n")
    (tmp_path / "evaluation" / "task_accuracy.py").write_text("from evaluation import run\n")
    (tmp_path / "evaluation" / "plots.py").write_text("import evaluation.run\n")
    graph = module_graph(tmp_path)
    assert graph["evaluation.plots"] == {"evaluation.run"}
    assert module_cycles(graph) == [["evaluation.run", "evaluation.task_accuracy"]]


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
