"""The planner stands above the stages (docs/design.md, "Config -> plan -> stages"): experiment/ turns the config
into a plan and hands each stage its part, so nothing below it (core/, data/, model/, training/, evaluation/,
reports/) imports experiment/ or takes the whole config. A function takes the whole config when it has a parameter
named ``cfg`` or ``config`` that is annotated ``DictConfig`` or the schema's root class (``Config``), or that is
unannotated and read as ``cfg.train``,
``cfg.eval``, ...: the schema's top-level sections. A parameter of another name annotated ``DictConfig`` (a section
of the config, ``t: DictConfig``) counts too: a stage takes typed settings, which say what it reads.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runs import TINY, assert_one_line_error
from repo_root import REPO

STAGES = ("core", "data", "model", "training", "evaluation", "reports")  # below experiment/ (test_imports.LAYERS)
NAMES = ("cfg", "config")
SECTIONS = ("model", "pe", "data", "task", "train", "eval", "logging", "sample", "inspect")


def _annotation_name(annotation: ast.expr | None) -> str | None:
    """``DictConfig``, ``omegaconf.DictConfig`` and the string ``"DictConfig"`` all name DictConfig."""
    if annotation is None:
        return None
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return annotation.value.rpartition(".")[2]
    if isinstance(annotation, ast.Attribute):
        return annotation.attr
    if isinstance(annotation, ast.Name):
        return annotation.id
    return ast.unparse(annotation)


def _reads_sections(function: ast.AST, name: str) -> bool:
    return any(
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == name
        and node.attr in SECTIONS
        for node in ast.walk(function)
    )


def whole_config_functions(path: Path, root: Path = REPO) -> list[str]:
    """``file:function(parameter)`` for each function of ``path`` that takes the whole config."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
        for argument in arguments:
            annotated = _annotation_name(argument.annotation)
            named = argument.arg in NAMES
            if annotated == "DictConfig" or (named and annotated == "Config"):
                found.append(f"{path.relative_to(root)}:{node.name}({argument.arg})")
            elif named and annotated is None and _reads_sections(node, argument.arg):
                found.append(f"{path.relative_to(root)}:{node.name}({argument.arg})")
    return found


def experiment_imports(path: Path, root: Path = REPO) -> list[str]:
    """Each import of experiment/ in ``path``, at the top, in a function or under TYPE_CHECKING."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found += [f"{path.relative_to(root)} imports {name}" for name in names if name.split(".")[0] == "experiment"]
    return found


def stage_sources(root: Path = REPO) -> list[Path]:
    return [path for package in STAGES for path in sorted((root / package).rglob("*.py"))]


def test_no_stage_takes_the_whole_config():
    assert [name for path in stage_sources() for name in whole_config_functions(path)] == []


def test_no_stage_imports_the_planner():
    assert [line for path in stage_sources() for line in experiment_imports(path)] == []


def test_the_counter_finds_each_way_of_taking_the_whole_config(tmp_path):
    module = tmp_path / "training" / "bad.py"
    module.parent.mkdir()
    module.write_text(
        "from omegaconf import DictConfig\n"
        "import omegaconf\n"
        "def a(cfg: DictConfig): pass\n"
        "def b(x, *, config: 'DictConfig'): pass\n"
        "def c(cfg: omegaconf.DictConfig): pass\n"
        "def d(cfg):\n    return cfg.train.lr\n"
        "def e(cfg):\n    return cfg.lr\n"  # a section handed in by another name: not the whole config
        "def f(settings: DictConfig): pass\n"
        "def f2(config: dict): pass\n"
        "class K:\n    def g(self, cfg: 'Config'): pass\n"
        "def h():\n    from experiment.config import validate\n"
    )
    assert whole_config_functions(module, root=tmp_path) == [
        "training/bad.py:a(cfg)",
        "training/bad.py:b(config)",
        "training/bad.py:c(cfg)",
        "training/bad.py:d(cfg)",
        "training/bad.py:f(settings)",
        "training/bad.py:g(cfg)",
    ]
    assert experiment_imports(module, root=tmp_path) == ["training/bad.py imports experiment.config"]


BAD_SEED = "train.seed=99999999999999999999"  # past MAX_SEED: refused by its domain
SMALL = [override for override in TINY if not override.startswith("pe=")]  # the jobs choose their schemes


@pytest.mark.slow
def test_check_plans_every_job_and_writes_nothing(cli, tmp_path):
    """train.py --check: the plan of each job, and not a file written (no Hydra run directory either)."""
    data = f"data.files=[{cli.corpus}]"
    command = [sys.executable, str(REPO / "train.py"), "--check", "-m", *SMALL, data, "pe=rope,alibi"]
    accepted = subprocess.run([*command, "train.seed=1,2"], cwd=tmp_path, env=cli.env, capture_output=True, text=True)
    assert accepted.returncode == 0 and accepted.stdout == accepted.stderr == "", accepted.stderr
    refused = subprocess.run(
        [*command, f"train.seed=1,{BAD_SEED.split('=')[1]}"], cwd=tmp_path, env=cli.env, capture_output=True, text=True
    )
    assert_one_line_error(refused, f"job 1 of the sweep (pe=rope {BAD_SEED})", "is out of its domain")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_study_refuses_a_bad_value_in_its_last_job_before_the_first_trains(cli, tmp_path):
    study_dir = tmp_path / "study"
    done = subprocess.run(
        [
            "bash",
            "scripts/study.sh",
            "--schemes",
            "rope,alibi",
            "--seed-list",
            f"1,{BAD_SEED.split('=')[1]}",
            str(study_dir),
            *SMALL,
            f"data.files=[{cli.corpus}]",
        ],
        cwd=REPO,
        env=cli.env,
        capture_output=True,
        text=True,
    )
    assert_one_line_error(done, f"job 1 of the sweep ({BAD_SEED})", "is out of its domain")
    assert not study_dir.exists()  # rope-s1 was never trained, and the study's folder never made
