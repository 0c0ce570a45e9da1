"""The data settings (data/config.py): the cache folder, validation's refusals, and configs/data/ against the
schema (CPU, no network)."""

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from repo_root import REPO

from core.errors import PosGPTError
from data import (
    DataConfig,
    load_splits,
    validate_data_config,
)
from data.config import resolve_cache_dir

pytestmark = pytest.mark.usefixtures("cache_dir")  # every test writes its token cache under its own tmp_path


# ---------------------------------------------------------------- config


def test_cache_dir_resolution(monkeypatch, cache_dir):
    assert resolve_cache_dir(DataConfig()) == cache_dir
    assert resolve_cache_dir(DataConfig(cache_dir="/somewhere")) == Path("/somewhere")
    monkeypatch.delenv("POSGPT_CACHE_DIR")
    assert resolve_cache_dir(DataConfig()) == Path.home() / ".cache" / "posgpt"


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"source": "ftp"}, "data.source='ftp' is not one of its choices: python_stdlib, text, hub"),
        ({"source": "text"}, "needs files"),
        ({"source": "text", "files": ["notes.docx"]}, "notes.docx"),
        ({"source": "hub"}, "hub_path"),
    ],
)
def test_validate_rejects(overrides, message):
    with pytest.raises(PosGPTError, match=message):
        validate_data_config(DataConfig(**overrides))


def test_validate_names_missing_and_empty_files(tmp_path):
    missing = tmp_path / "missing.txt"
    with pytest.raises(PosGPTError, match=str(missing)):
        validate_data_config(DataConfig(source="text", files=[str(missing)]))
    empty = tmp_path / "empty.txt"
    empty.touch()
    with pytest.raises(PosGPTError, match=f"{empty} is empty"):
        validate_data_config(DataConfig(source="text", files=[str(empty)]))
    folder = tmp_path / "folder.txt"
    folder.mkdir()
    with pytest.raises(PosGPTError, match=f"{folder} does not exist or is not a file"):
        load_splits(DataConfig(source="text", files=[str(folder)]))


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "data").glob("*.yaml")), ids=lambda p: p.stem)
def test_data_configs_fit_the_schema(path):
    text = path.read_text()
    assert text.startswith("#"), "each data config starts with a comment saying what it is"
    assert "defaults" not in yaml.safe_load(text)
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DataConfig), OmegaConf.load(path)))
    assert cfg.name == path.stem
    if cfg.source == "text" and not cfg.files:
        with pytest.raises(PosGPTError, match="needs files"):
            validate_data_config(cfg)
    else:
        validate_data_config(cfg)
