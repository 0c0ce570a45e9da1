"""House rules a newcomer relies on: the code's defaults are the shipped ones, scripts run from anywhere, and no
code outside model/pe/ knows a positional scheme by name."""

import ast
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from experiment.compose import compose_config
from experiment.config import Config
from model.pe import SCHEMES

REPO = Path(__file__).resolve().parents[1]
POSGPT_PACKAGES = {"core", "data", "model", "experiment", "evaluation", "training"}


def differences(composed: dict, reference: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested dicts."""
    found = []
    for key in sorted(composed.keys() | reference.keys()):
        ours, theirs = composed.get(key), reference.get(key)
        if isinstance(ours, dict) and isinstance(theirs, dict):
            found += differences(ours, theirs, f"{prefix}{key}.")
        elif ours != theirs:
            found.append(f"{prefix}{key}: shipped {ours!r}, dataclass {theirs!r}")
    return found


def test_dataclass_defaults_are_the_shipped_defaults():
    """`python train.py` (configs/config.yaml and its default groups) and the dataclasses agree on every key:
    ModelConfig() is the shipped default model, DataConfig() the default corpus, and so on."""
    shipped = OmegaConf.to_container(compose_config([]), resolve=True)
    reference = OmegaConf.to_container(OmegaConf.structured(Config))
    shipped.pop("pe"), reference.pop("pe")  # each scheme's own, below
    assert differences(shipped, reference) == []


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_each_schemes_yaml_sets_its_dataclass_defaults(name):
    shipped = OmegaConf.to_container(compose_config([f"pe={name}"]).pe, resolve=True)
    assert differences(shipped, OmegaConf.to_container(OmegaConf.structured(SCHEMES[name].config_class))) == []


@pytest.mark.parametrize("path", sorted((REPO / "scripts").glob("*.py")), ids=lambda path: path.name)
def test_scripts_put_the_repository_on_the_path_before_importing_it(path):
    """`python scripts/<name>.py` has only scripts/ on sys.path: `import _repo` must come before posgpt's imports
    (ruff --fix once removed it as unused)."""
    imports = [node for node in ast.parse(path.read_text()).body if isinstance(node, (ast.Import, ast.ImportFrom))]
    names = [alias.name if isinstance(node, ast.Import) else node.module for node in imports for alias in node.names]
    posgpt = [i for i, name in enumerate(names) if name and name.split(".")[0] in POSGPT_PACKAGES]
    if posgpt:
        assert "_repo" in names[: posgpt[0]], f"{path.name} imports posgpt without `import _repo` first"


def python_sources() -> list[Path]:
    """Every posgpt source file but the tests."""
    return [path for path in sorted(REPO.rglob("*.py")) if path.relative_to(REPO).parts[0] not in ("tests", "docs")]


def test_no_module_state_drives_a_forward_pass():
    """Per-forward settings (attention capture, the scheme's positions) travel as arguments: no `global`."""
    offenders = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for path in python_sources()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Global)
    ]
    assert offenders == []


def test_the_scheme_is_registered_once_and_handed_to_every_layer():
    from model import GPT
    from model.gpt import ModelConfig

    model = GPT(ModelConfig(n_embd=32, n_layer=3), SCHEMES["t5"].config_class(), train_seq_len=16)
    assert [key for key in model.state_dict() if key.endswith(".table")] == ["pe.table"]  # T5's, not once per layer
    probs: list = []
    model(torch.randint(0, 100, (1, 8)), capture=probs)
    assert len(probs) == 3  # one per layer, through the argument
