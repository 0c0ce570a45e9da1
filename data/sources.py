"""Turn a DataConfig into documents, each labelled with the split it belongs to.

- python_stdlib: every .py file of the running Python's standard library, one document per file: about
  31 MB of text that every machine has without a download.
- text: local files or http(s) URLs read by datasets' packaged loaders; a .txt file is one document,
  .jsonl/.json/.parquet files hold one document per row.
- hub: a dataset on the Hugging Face Hub, downloaded or streamed.

Documents go to train or val by a stable hash (of the file's path for the stdlib, of the text otherwise),
so adding a document never moves another one across splits, and a repeated text never lands in both.
When that leaves a local corpus with an empty split (a single book), its documents are labelled "all"
instead and the cache splits the token stream: the last val_fraction of the tokens become validation.

A local corpus (stdlib, local files) keeps each text once: a document whose text equals an earlier one's
is dropped before the split, and the count is printed. Otherwise a file listed twice, split by tokens,
would put its tail in validation and the same text in training. Rows without a text (null or absent
field) are counted: more than half of them is refused, fewer are skipped with a warning (ROW_RULE).
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import sysconfig
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain, islice
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import PosGPTError, first_line
from core.files import TMP_PREFIX, not_utf8, read_user_text
from data.config import DataConfig, is_url, loader_for, resolve_cache_dir

if TYPE_CHECKING:
    import datasets

ALL = "all"  # label of documents whose token stream is split, instead of the documents themselves

Documents = Iterator[tuple[str, str]]  # (label: "train" | "val" | ALL, text)


@dataclass(frozen=True)
class Corpus:
    """The documents of a data config, ready to be tokenized."""

    fingerprint: str  # changes whenever the documents or their labels may have changed
    documents: Callable[[], Documents]  # a fresh pass over the documents, in a fixed order
    n_documents: int | None  # None for hub datasets, whose count is only known after reading them
    end_with_eot: bool  # end each document with <|endoftext|> (False when rows are lines of one text)


def hash_split(key: str, val_fraction: float) -> str:
    """ "val" for a stable val_fraction share of keys, else "train" (sha1, unlike hash(), agrees across runs)."""
    unit = int.from_bytes(hashlib.sha1(key.encode("utf-8", "surrogatepass")).digest()[:8], "big") / 2**64
    return "val" if unit < val_fraction else "train"


def open_corpus(cfg: DataConfig) -> Corpus:
    """The documents cfg describes; cfg must have passed config.validate_data_config."""
    opener = {"python_stdlib": _stdlib_corpus, "text": _text_corpus, "hub": _hub_corpus}[cfg.source]
    return opener(cfg)


def stdlib_files() -> tuple[Path, list[str]]:
    """The standard library's folder and its non-empty .py files, as sorted posix paths relative to it."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, subfolders, names in os.walk(root):
        # Installed packages live inside the stdlib folder but differ per machine: keep them out.
        subfolders[:] = [name for name in subfolders if name not in ("site-packages", "dist-packages")]
        for name in names:
            path = Path(folder, name)
            if name.endswith(".py") and path.stat().st_size > 0:
                files.append(path.relative_to(root).as_posix())
    return root, sorted(files)


def _stdlib_corpus(cfg: DataConfig) -> Corpus:
    root, files = stdlib_files()

    def documents() -> Iterator[tuple[str, str]]:
        # A few test files are deliberately not UTF-8; a replacement character is harmless there.
        return ((file, (root / file).read_text(encoding="utf-8", errors="replace")) for file in files)

    return _local_corpus(documents, cfg)


def _text_corpus(cfg: DataConfig) -> Corpus:
    readers = _load_files(cfg)
    counts = [RowCount() for _ in readers]

    def documents() -> Iterator[tuple[str, str]]:
        for count in counts:  # each pass counts afresh
            count.rows = count.missing = 0
        texts = chain.from_iterable(read(count) for (_, _, read), count in zip(readers, counts))
        return ((text, text) for text in texts)  # a document's split follows its text

    corpus = _local_corpus(documents, cfg)
    for (where, field, _), count in zip(readers, counts):
        count.check(where, field)
    return corpus


def _local_corpus(documents: Callable[[], Iterator[tuple[str, str]]], cfg: DataConfig) -> Corpus:
    """A corpus read from this machine from documents() = (split key, text) pairs: cheap to read twice, so
    its fingerprint hashes the content itself, and each text is kept once (the first time it appears)."""
    labels, keep, seen = [], [], set()
    fingerprint = hashlib.sha256()
    for key, text in documents():
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
        keep.append(digest not in seen)
        if keep[-1]:
            seen.add(digest)
            labels.append(hash_split(key, cfg.val_fraction))
            fingerprint.update(digest)
    duplicates = len(keep) - len(labels)
    if duplicates:
        print(
            f"data: {cfg.name}: dropped {duplicates} of {len(keep)} documents whose text repeats an earlier one "
            "(so that no text is in both train and val)",
            flush=True,
        )
    if not {"train", "val"} <= set(labels):
        labels = [ALL] * len(labels)
    fingerprint.update(json.dumps(labels).encode())

    def kept_documents() -> Documents:
        texts = (text for (_, text), kept in zip(documents(), keep, strict=True) if kept)
        return zip(labels, texts, strict=True)

    return Corpus(fingerprint.hexdigest(), kept_documents, len(labels), cfg.rows_are_documents)


@dataclass
class RowCount:
    """Rows read from a table and, of them, rows without a text (the field null or absent).

    ROW_RULE: when more than half of the rows have no text, the text is probably in another column, and
    the corpus is refused; when fewer do, they are skipped and their number is printed.
    """

    rows: int = 0
    missing: int = 0

    def check(self, where: str, field: str) -> None:
        if not self.missing:
            return
        if 2 * self.missing > self.rows:
            raise PosGPTError(
                f"{where}: {self.missing:,} of {self.rows:,} rows have no {field!r} value: set data.text_field "
                "to the column that holds the text, or fill in the rows"
            )
        print(
            f"data: warning: {where}: skipped {self.missing:,} of {self.rows:,} rows that have no {field!r} value",
            flush=True,
        )


def _load_files(cfg: DataConfig) -> list[tuple[str, str, Callable[[RowCount], Iterator[str]]]]:
    """cfg.files as (files, text field, reader of their texts), in the order listed (files of one loader
    together).

    Local .txt files are read here, so a file that is not UTF-8 is named with the byte where it fails.
    Other files go through datasets' loaders, whose own cache knows a local file only by its mtime: it is
    kept under a folder named by the files' content, so a file edited in place is read afresh.
    """
    by_loader: dict[str, list[str]] = {}
    for path in cfg.files:
        by_loader.setdefault(loader_for(path), []).append(path if is_url(path) else str(Path(path).expanduser()))
    readers = []
    for loader, files in by_loader.items():
        if loader == "text" and not any(is_url(file) for file in files):
            readers.append((", ".join(files), "text", functools.partial(_read_txt_files, files)))
            continue
        field = "text" if loader == "text" else cfg.text_field
        table = _load_table(cfg, loader, files, field)
        readers.append((", ".join(files), field, functools.partial(_texts, table, field)))
    return readers


def _read_txt_files(files: list[str], counts: RowCount) -> Iterator[str]:
    """Each file's text, one document (a file always has its text: `counts` stays at zero)."""
    for file in files:
        yield read_user_text(file, "data.files")


def _content_digest(files: list[str], utf8: bool) -> str:
    """sha256 of the local files' bytes (URLs by name: datasets checks their ETag itself), checking on the
    way, if `utf8`, that each file is UTF-8 (pyarrow would fail later on the text, without saying where)."""
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.encode() + b"\0")
        if is_url(file):
            continue
        decoder, offset = codecs.getincrementaldecoder("utf-8")(), 0
        try:
            with open(file, "rb") as f:
                while chunk := f.read(1 << 24):
                    digest.update(chunk)
                    if utf8:
                        pending = len(decoder.getstate()[0])  # bytes of a character cut by the last chunk
                        try:
                            decoder.decode(chunk)
                        except UnicodeDecodeError as e:
                            raise not_utf8("data.files", file, offset - pending + e.start, e.reason) from None
                    offset += len(chunk)
            if utf8 and decoder.getstate()[0]:
                raise not_utf8("data.files", file, offset - len(decoder.getstate()[0]), "unexpected end of data")
        except OSError as e:
            raise PosGPTError(f"data.files: cannot read {file} ({e.strerror}); fix it or drop it") from None
    return digest.hexdigest()


def _load_table(cfg: DataConfig, loader: str, files: list[str], field: str) -> datasets.Dataset:
    """The files as one table, its text ``field`` checked (_check_field, and RowCount's rule on its nulls). datasets
    writes its cache while it reads: a first read goes into a scratch folder, renamed into the cache only once the
    table is accepted, so that a refused corpus leaves no cache behind."""
    cache_dir = resolve_cache_dir(cfg) / "datasets" / _content_digest(files, utf8=loader != "parquet")[:16]
    if cache_dir.is_dir():
        return _read_table(loader, files, cache_dir)
    scratch = resolve_cache_dir(cfg) / f"{TMP_PREFIX}datasets-{cache_dir.name}.{os.getpid()}"
    try:
        table = _read_table(loader, files, scratch)
        where = ", ".join(files)
        _check_field(table, field, where)
        counts = RowCount(len(table), table.data.column(field).null_count)
        if 2 * counts.missing > counts.rows:  # refused (fewer are skipped, and said so, as the texts are read)
            counts.check(where, field)
        del table  # its memory maps point into the scratch folder
        cache_dir.parent.mkdir(parents=True, exist_ok=True)
        os.replace(scratch, cache_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return _read_table(loader, files, cache_dir)


def _read_table(loader: str, files: list[str], cache_dir: Path) -> datasets.Dataset:
    import datasets  # here, not at the top: it brings pandas and pyarrow, a third of every command's start-up

    # sample_by="document": a whole .txt file is one document, not one per line.
    options = {"sample_by": "document"} if loader == "text" else {}
    try:
        with _quiet(datasets):
            return datasets.load_dataset(loader, data_files=files, split="train", cache_dir=str(cache_dir), **options)
    except ImportError as e:  # datasets reads URLs through fsspec's HTTP filesystem, without installing it
        raise PosGPTError(
            f"data.files: reading URLs needs aiohttp ({e}): pip install aiohttp, or download the file "
            "and list its local path"
        ) from e
    except (OSError, ValueError, datasets.exceptions.DatasetsError) as e:  # ValueError: pyarrow's ArrowInvalid
        reason = first_line(e.__cause__ or e).split(": ", 1)[-1]  # "JSON parse error: ...", not datasets' wrapper
        raise PosGPTError(f"data.files: could not read {', '.join(files)} ({reason}); fix or drop these files") from e


@contextlib.contextmanager
def _quiet(datasets: types.ModuleType) -> Iterator[None]:
    """datasets' progress bar and its logged errors off while it reads the files: for a file it cannot read, they
    stood above posgpt's one line, which names the file and the reason itself."""
    bars, verbosity = datasets.utils.logging.is_progress_bar_enabled(), datasets.utils.logging.get_verbosity()
    datasets.utils.logging.disable_progress_bar()
    datasets.utils.logging.set_verbosity(logging.CRITICAL)
    try:
        yield
    finally:
        datasets.utils.logging.set_verbosity(verbosity)
        if bars:
            datasets.utils.logging.enable_progress_bar()


def _hub_corpus(cfg: DataConfig) -> Corpus:
    import datasets  # here, not at the top: see _load_table

    where = cfg.hub_path + (f" ({cfg.hub_name})" if cfg.hub_name else "")
    # Offline, datasets retries every request for about 25 s before it gives up; one quick probe answers
    # at once. In offline mode (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE) datasets reads its own cache and never touches
    # the network, so no probe is made.
    if not datasets.config.HF_HUB_OFFLINE and not _hub_reachable():
        raise PosGPTError(
            f"could not download {where} from the Hugging Face Hub (no network?). Use data=text "
            "data.files=[...] with local files, or set HF_DATASETS_OFFLINE=1 if it is already cached"
        )
    train = _load_hub(cfg, cfg.hub_split, where)
    val = _load_hub(cfg, cfg.hub_val_split, where) if cfg.hub_val_split else None

    def documents() -> Documents:
        # A stream is only counted as it is read: the rule on rows without text applies at its end.
        counts = RowCount()
        train_texts = _texts(train, cfg.text_field, counts, cfg.max_documents)
        if val is None:
            labelled = ((hash_split(text, cfg.val_fraction), text) for text in train_texts)
        else:
            val_texts = _texts(val, cfg.text_field, counts, cfg.max_documents)
            labelled = chain((("train", text) for text in train_texts), (("val", text) for text in val_texts))
        yield from labelled
        counts.check(where, cfg.text_field)

    # A stream cannot be hashed without reading it all, so the key is what names the data, plus the
    # fingerprint datasets gives a downloaded table (it follows the files' revision); a stream has none.
    identity = {
        name: getattr(cfg, name)
        for name in ("hub_path", "hub_name", "hub_split", "hub_val_split", "text_field", "max_documents")
    }
    identity["val_fraction"] = None if val is not None else cfg.val_fraction
    identity["revision"] = [getattr(table, "_fingerprint", None) for table in (train, val) if table is not None]
    fingerprint = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    return Corpus(fingerprint, documents, None, cfg.rows_are_documents)


# The variables that put datasets in offline mode (datasets.config.HF_HUB_OFFLINE), the more specific first.
OFFLINE_VARIABLES = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")


def offline_variable() -> str:
    """The environment variable that put the Hugging Face libraries in offline mode, to name it in a refusal."""
    truthy = ("1", "ON", "YES", "TRUE")
    return next((name for name in OFFLINE_VARIABLES if os.environ.get(name, "").upper() in truthy), "HF_HUB_OFFLINE")


def _hub_reachable(timeout_s: float = 5.0) -> bool:
    import huggingface_hub  # here, not at the top: see _load_table

    try:
        huggingface_hub.get_session().head(huggingface_hub.constants.ENDPOINT, timeout=timeout_s)
    except Exception:  # whatever stops the request (DNS, refused, timeout, proxy) means: out of reach
        return False
    return True


def _load_hub(cfg: DataConfig, split: str, where: str) -> datasets.Dataset | datasets.IterableDataset:
    import datasets  # here, not at the top: see _load_table

    try:
        table = datasets.load_dataset(cfg.hub_path, cfg.hub_name, split=split, streaming=cfg.streaming)
    except (OSError, ValueError, datasets.exceptions.DatasetsError) as e:
        if datasets.config.HF_HUB_OFFLINE:  # a corpus missing from the cache, not a wrong name
            raise PosGPTError(
                f"could not load split {split!r} of {where}: {offline_variable()}=1 keeps the Hugging Face Hub "
                f"offline and it is not in the local cache ({datasets.config.HF_DATASETS_CACHE}); unset "
                f"{offline_variable()} to download it, or use data=text data.files=[...] with local files"
            ) from e
        raise PosGPTError(
            f"could not load split {split!r} of {where} from the Hugging Face Hub ({e}); "
            "check data.hub_path, data.hub_name, data.hub_split and data.hub_val_split"
        ) from e
    _check_field(table, cfg.text_field, where)
    return table


def _check_field(table: datasets.Dataset | datasets.IterableDataset, field: str, where: str) -> None:
    columns = table.column_names
    if columns is not None and field not in columns:  # a stream may not know its columns before reading
        raise PosGPTError(f"{where} has no column {field!r}: set data.text_field to one of {columns}")
    feature = (table.features or {}).get(field)
    if feature is not None and getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise PosGPTError(f"{where}: column {field!r} holds {feature}, not text; set data.text_field to a text column")


def _texts(
    table: datasets.Dataset | datasets.IterableDataset, field: str, counts: RowCount, limit: int | None = None
) -> Iterator[str]:
    """The texts of the first `limit` rows, skipping empty ones (they hold nothing to learn) and rows without
    a text, which `counts` counts."""
    batches = table.select_columns([field]).iter(batch_size=1024)
    for text in islice(chain.from_iterable(batch[field] for batch in batches), limit):
        counts.rows += 1
        if text is None:
            counts.missing += 1
        elif text:
            yield text
