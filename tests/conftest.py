import os
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))  # scripts import _repo, as when run as python scripts/<name>.py
os.environ.setdefault("WANDB_SILENT", "true")
if os.environ.get("PYTEST_XDIST_WORKER"):  # pyproject.toml runs a worker per core: one torch thread each
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Token caches go to one per-session temporary directory, never to the user's ~/.cache."""
    monkeypatch.setenv("POSGPT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "posgpt-cache"))


from cli_runs import cli, reference  # noqa: E402, F401  (the session fixtures, for every test module)
