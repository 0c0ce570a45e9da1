"""The corpora (data/sources.py): the standard library's, text files (txt, jsonl, parquet), the hub's offline
refusals, duplicates and rows without text, and invalid UTF-8 located (CPU, no network)."""

import json
import time

import numpy as np
import pytest
from data_files import all_tokens, write_jsonl
from repo_root import REPO

from core.errors import PosGPTError
from data import (
    EOT_TOKEN,
    DataConfig,
    TokenArray,
    gpt2_encoding,
    load_splits,
    sources,
)

pytestmark = pytest.mark.usefixtures("cache_dir")  # every test writes its token cache under its own tmp_path
SHARED_DATA = REPO.parent / "shared" / "data"


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
