"""The fixtures of the tests of data/ (tests/data/test_<module>.py): each test's own token cache (every file asks for
it with ``pytestmark``, as one file's autouse fixture did before the split by module) and a count of the shards
tokenized."""

import pytest

from data import cache


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """Every test writes its token cache (and datasets' conversions) under its own tmp_path."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("POSGPT_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def shard_writes(monkeypatch):
    """Counts the shards tokenized in this process (use with num_proc=1)."""
    written = []
    original = cache._write_shard

    def counting(path, docs, end_with_eot):
        written.append(path.name)
        return original(path, docs, end_with_eot)

    monkeypatch.setattr(cache, "_write_shard", counting)
    return written
