"""Tests of data/: tokenizer, sources, token cache, token arrays and batch sampling (CPU, no network)."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
from data_files import all_tokens, write_jsonl

from core.errors import PosGPTError
from data import (
    EOT_TOKEN,
    DataConfig,
    cache,
    gpt2_encoding,
    load_split,
    load_splits,
    validate_data_config,
)
from data.config import resolve_cache_dir

pytestmark = pytest.mark.usefixtures("cache_dir")  # every test writes its token cache under its own tmp_path


@pytest.mark.slow  # worker processes tokenize the standard library
def test_stdlib_tokenized_in_parallel_and_cached(capsys):
    cfg = DataConfig(num_proc=2)
    splits = load_splits(cfg)
    assert len(splits["train"]) > 5_000_000 and len(splits["val"]) > 10_000
    assert "wrote tokens" in capsys.readouterr().out
    again = load_splits(cfg)
    assert "using cached tokens" in capsys.readouterr().out
    assert [len(again[s]) for s in ("train", "val")] == [len(splits[s]) for s in ("train", "val")]
    window = again["val"].read(1000, 64)
    assert window.dtype == np.uint16 and window.max() < 50257


def test_single_document_splits_the_token_stream(tmp_path):
    text = "A single book, too small to split by documents. " * 50
    book = tmp_path / "book.txt"
    book.write_text(text)
    splits = load_splits(DataConfig(source="text", files=[str(book)], val_fraction=0.1, num_proc=1))
    expected = gpt2_encoding().encode_ordinary(text) + [EOT_TOKEN]
    assert all_tokens(splits).tolist() == expected
    assert len(splits["val"]) == len(expected) - int(len(expected) * 0.9)


def test_the_tokenizing_bar_follows_logging_progress(tmp_path, capsys):
    """Tokenizing shows a progress bar (stderr) unless the caller passes logging.progress=false, as every other bar;
    the tokens are the same either way."""
    book = tmp_path / "book.txt"
    book.write_text("A single book. " * 50)
    quiet = load_splits(DataConfig(name="quiet", source="text", files=[str(book)], num_proc=1), progress=False)
    assert "tokenizing" not in capsys.readouterr().err
    shown = load_splits(DataConfig(name="shown", source="text", files=[str(book)], num_proc=1))
    assert "tokenizing: 100%" in capsys.readouterr().err
    assert all_tokens(quiet).tolist() == all_tokens(shown).tolist()


# ---------------------------------------------------------------- cache


def many_documents(tmp_path: Path, count: int = 80) -> DataConfig:
    """A jsonl corpus cut into many small shards."""
    texts = [f"Document {i}: " + "lorem ipsum dolor sit amet " * (i % 7 + 1) for i in range(count)]
    rows = write_jsonl(tmp_path / "docs.jsonl", texts)
    return DataConfig(name="docs", source="text", files=[str(rows)], val_fraction=0.2, shard_chars=500, num_proc=1)


def test_cache_is_reused_and_keyed_by_content(tmp_path, shard_writes, capsys, monkeypatch):
    cfg = many_documents(tmp_path)
    first = load_splits(cfg)
    assert len(shard_writes) > 4
    folder = first["train"].shards[0].parent
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["complete"] and manifest["tokenizer"] == "gpt2" and manifest["dtype"] == "uint16"
    assert set(manifest["shards"]) == {"train", "val"}

    # A cache hit never builds the tokenizer (it costs ~2 s of every run's start).
    shard_writes.clear()
    with monkeypatch.context() as patch:
        patch.setattr(cache, "gpt2_encoding", lambda: pytest.fail("the tokenizer was built for a cache hit"))
        second = load_splits(cfg)
    assert shard_writes == [] and f"using cached tokens {folder}" in capsys.readouterr().out
    assert np.array_equal(all_tokens(first), all_tokens(second))

    # Edited in place, its size and mtime kept (datasets' own cache knows a local file by its mtime alone).
    rows = Path(cfg.files[0])
    stat = rows.stat()
    rows.write_text(rows.read_text().replace("Document 3:", "Document 8:"))
    os.utime(rows, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (rows.stat().st_size, rows.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    changed = load_splits(cfg)
    assert changed["train"].shards[0].parent != folder and shard_writes
    assert not np.array_equal(all_tokens(first), all_tokens(changed))


def test_interrupted_tokenization_resumes(tmp_path, shard_writes):
    cfg = many_documents(tmp_path)
    reference = all_tokens(load_splits(cfg))
    folder = resolve_cache_dir(cfg)
    (folder,) = [path for path in folder.iterdir() if path.name.startswith("docs-")]
    # As if the run had died: one shard never written, the manifest never completed.
    victim = sorted(folder.glob("train_*.bin"))[2]
    victim.unlink()
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["complete"] = False
    (folder / "manifest.json").write_text(json.dumps(manifest))

    shard_writes.clear()
    assert np.array_equal(all_tokens(load_splits(cfg)), reference)
    assert shard_writes == [victim.name]

    # A shard deleted behind a complete manifest is noticed as well.
    victim.unlink()
    shard_writes.clear()
    assert np.array_equal(all_tokens(load_splits(cfg)), reference)
    assert shard_writes == [victim.name]


def cache_entry(cfg: DataConfig) -> Path:
    (folder,) = [path for path in resolve_cache_dir(cfg).iterdir() if path.name.startswith(f"{cfg.name}-")]
    return folder


def test_damaged_shard_is_tokenized_again_alone(tmp_path, shard_writes, capsys):
    cfg = many_documents(tmp_path)
    reference = all_tokens(load_splits(cfg))
    folder = cache_entry(cfg)
    truncated, flipped = sorted(folder.glob("train_*.bin"))[1:3]
    with open(truncated, "r+b") as f:
        f.truncate(truncated.stat().st_size - 2)
    data = bytearray(flipped.read_bytes())
    data[10] ^= 1  # same size, one bit off: only the checksum tells
    flipped.write_bytes(data)

    shard_writes.clear()
    capsys.readouterr()
    assert np.array_equal(all_tokens(load_splits(cfg)), reference)
    assert sorted(shard_writes) == [truncated.name, flipped.name]
    assert f"2 shard(s) of {folder} do not match the manifest" in capsys.readouterr().out
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["complete"] and sum(len(shards) for shards in manifest["shards"].values()) > 4


@pytest.mark.parametrize(
    "manifest, problem",
    [
        ('[{"shards": []}]', "a list, not an object"),
        ('{"key": "%s", "complete": true, "shards": []}', "'shards' is not an object of lists"),
        ('{"key": "%s", "complete": true, "shards": {}}', "complete, but lists no shards"),
        ('{"key": "%s", "shards": {"train": []}}', "no 'complete' flag"),
        (
            '{"key": "%s", "complete": true, "shards": {"train": [{"file": "../x.bin", "tokens": 1, "sha256": ""}]}}',
            "a malformed shard entry",
        ),
        ('{"key": "other", "complete": true, "shards": {}}', "another cache key"),
        ('{"key": "%s", "comp', "is not readable JSON"),
    ],
)
def test_malformed_manifest_is_rebuilt(tmp_path, capsys, manifest, problem):
    cfg = many_documents(tmp_path, count=20)
    reference = all_tokens(load_splits(cfg))
    folder = cache_entry(cfg)
    key = json.loads((folder / "manifest.json").read_text())["key"]
    (folder / "manifest.json").write_text(manifest.replace("%s", key))
    capsys.readouterr()
    assert np.array_equal(all_tokens(load_splits(cfg)), reference)
    out = capsys.readouterr().out
    assert problem in out and "tokenizing the entry again" in out and "wrote tokens" in out
    assert json.loads((folder / "manifest.json").read_text())["complete"] is True


def test_unwritable_cache_is_refused_with_the_way_out(tmp_path, monkeypatch):
    cfg = many_documents(tmp_path, count=10)

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cache, "_write_json", read_only)
    with pytest.raises(PosGPTError, match=r"cannot write the token cache .*docs-.*rm -r"):
        load_splits(cfg)


def test_corpus_identity_follows_the_tokens(tmp_path, capsys):
    cfg = many_documents(tmp_path, count=20)
    identity = cache.corpus_identity(load_splits(cfg))
    assert set(identity) == {"train", "val"} and identity["train"]["tokens"] > 0
    cache.check_corpus(identity, load_splits(cfg), cfg)  # the same tokens: accepted
    cache.check_corpus(None, load_splits(cfg), cfg)  # a checkpoint from before identities: accepted
    other = DataConfig(**{**vars(cfg), "val_fraction": 0.5})
    with pytest.raises(PosGPTError, match=r"data 'docs' \(files .*docs.jsonl\) holds other tokens than the checkpoint"):
        cache.check_corpus(identity, load_splits(other), other)


def test_eval_split(tmp_path, capsys):
    cfg = many_documents(tmp_path, count=20)
    splits = load_splits(cfg)
    trained = vars(cfg)
    identity = cache.corpus_identity(splits)
    assert cache.eval_tokens(cfg, trained, identity).name == "val"
    assert cache.eval_tokens(cfg, trained, None).name == "val"  # no identity: the settings decide
    renamed = DataConfig(**{**trained, "name": "renamed"})
    assert cache.eval_tokens(renamed, trained, identity).name == "val"
    book = tmp_path / "book.txt"
    book.write_text("Another text. " * 100)
    other = DataConfig(name="book", source="text", files=[str(book)])
    tokens = cache.eval_tokens(other, trained, identity)
    assert tokens.name == "all" and len(tokens) == len(load_splits(other)["train"]) + len(load_splits(other)["val"])
    explicit = DataConfig(**{**vars(other), "eval_split": "train"})
    assert cache.eval_tokens(explicit, trained, identity).name == "train"
    # The training corpus with another split: its val split may hold training text.
    shifted = DataConfig(**{**trained, "val_fraction": 0.5})
    with pytest.raises(PosGPTError, match="data.eval_split=val"):
        cache.eval_tokens(shifted, trained, identity)
    with pytest.raises(PosGPTError, match="data.eval_split='last' is not one of its choices"):
        validate_data_config(DataConfig(eval_split="last"))


def test_empty_split_is_named():
    manifest = {"shards": {"train": []}}
    with pytest.raises(PosGPTError, match="the train split of data 'x' is empty"):
        cache._nonempty(cache._streams(manifest, Path("."), 0.1)["train"], DataConfig(name="x"))


def test_load_split_checks_the_name():
    with pytest.raises(PosGPTError, match="unknown data split 'test'"):
        load_split(DataConfig(), "test")
