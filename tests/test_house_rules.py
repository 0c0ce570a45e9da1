"""House rules a newcomer relies on: the code's defaults are the shipped ones, scripts run from anywhere, and no
code outside model/pe/ knows a positional scheme by name."""

import ast
from pathlib import Path

import pytest
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
