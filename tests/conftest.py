import os
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))  # scripts import _repo, as when run as python scripts/<name>.py
# The tests' shared helpers (tests/support/: cli_runs, tiny_checkpoint, ...) are imported by name. pyproject.toml's
# --import-mode=importlib imports each test file by its path, so test files of one basename in two folders
# (tests/evaluation/test_results.py, tests/docs/test_results.py) do not clash, and none is importable by another.
sys.path.insert(0, str(REPO / "tests" / "support"))
os.environ.setdefault("WANDB_SILENT", "true")
if os.environ.get("PYTEST_XDIST_WORKER"):  # pyproject.toml runs a worker per core: one torch thread each
    torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Token caches go to one per-session temporary directory, never to the user's ~/.cache. Session-scoped and
    autouse, so it is set before any other fixture runs: a per-test setting came after the session and module
    fixtures that train (the reference run), which then tokenized into ~/.cache, and a later test in the same
    worker tokenized its corpus again and printed a progress bar beside a one-line refusal."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("POSGPT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "posgpt-cache"))
        yield


def _seed_everything() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="module")
def _seeded_module():
    """A module's fixtures draw the same numbers whichever test file ran before it in the same worker."""
    _seed_everything()


@pytest.fixture(autouse=True)
def _fresh_state():
    """Every test starts from the same state of torch's, numpy's and Python's global generators, so a test that
    draws from them (torch.randn without a generator) draws the same numbers on every run and in any order; and
    with gradients on, as a fresh process: a script's main() called in-process turns them off for good, which
    failed whichever test its worker ran next (test_pe_fire, after test_attention_on_value)."""
    _seed_everything()
    torch.set_grad_enabled(True)


from cli_runs import cli, reference  # noqa: E402, F401  (the session fixtures, for every test module)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files that hold the longest tests run first: files with an e2e test, then files with a slow one, then the
    rest, each group in its collected order. With ``--dist loadfile`` a file goes whole to whichever worker is free,
    so a long file started last keeps one worker busy after the other has finished (longest first packs them)."""
    rank: dict[Path, int] = {}
    for item in items:
        own = 0 if item.get_closest_marker("e2e") else 1 if item.get_closest_marker("slow") else 2
        rank[item.path] = min(rank.get(item.path, 2), own)
    items.sort(key=lambda item: rank[item.path])
