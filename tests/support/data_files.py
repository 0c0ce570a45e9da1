"""Corpora and token arrays written for the tests of data/ (tests/data/test_<module>.py): documents decoded,
jsonl files, every token of the splits, a corpus of many documents, a cache entry, a sharded token array."""

import json
from pathlib import Path

import numpy as np

from data import (
    TokenArray,
)


def write_jsonl(path: Path, texts: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: text, "id": i}) + "\n" for i, text in enumerate(texts)))
    return path


def all_tokens(splits: dict[str, TokenArray]) -> np.ndarray:
    return np.concatenate([splits[s].read(0, len(splits[s])) for s in ("train", "val")])


# ---------------------------------------------------------------- token arrays and batches


def token_array(tmp_path: Path, sizes: list[int]) -> tuple[TokenArray, np.ndarray]:
    """A TokenArray over shards of the given sizes, and the concatenation it should equal."""
    rng = np.random.default_rng(0)
    paths, parts = [], []
    for i, size in enumerate(sizes):
        part = rng.integers(0, 50257, size=size, dtype=np.uint16)
        part.tofile(tmp_path / f"train_{i:06d}.bin")
        paths.append(tmp_path / f"train_{i:06d}.bin")
        parts.append(part)
    return TokenArray(paths, name="train"), np.concatenate(parts)
