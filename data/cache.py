"""Tokenize a corpus once into uint16 shard files, and find them again on later runs.

One cache entry, <cache_dir>/<name>-<key>/, holds:
    manifest.json         what the entry holds; "complete" turns true once every shard is written
    train_000000.bin ...  token ids as uint16, every document followed by <|endoftext|>
    val_000000.bin ...
    all_000000.bin ...    instead of train/val when the token stream is split (see sources.py)

The key hashes all that decides the tokens: the tokenizer, the documents and their split labels
(Corpus.fingerprint), whether documents end with <|endoftext|>, and the shard size. Each shard is
written to a temporary file and renamed, so a shard file that exists is whole: an interrupted run keeps
its finished shards, and the next one tokenizes only the missing ones.
"""

import hashlib
import json
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, as_completed, wait
from pathlib import Path

import numpy as np
from tqdm import tqdm

from core.errors import PosGPTError
from data.config import DataConfig, resolve_cache_dir, validate
from data.sources import ALL, Corpus, Documents, open_corpus
from data.tokenizer import EOT_TOKEN, gpt2_encoding
from data.tokens import TokenArray

FORMAT_VERSION = 1  # bump when the layout or the tokenization rules change, to leave old entries behind
MANIFEST = "manifest.json"
SPLITS = ("train", "val")


def load_splits(cfg: DataConfig) -> dict[str, TokenArray]:
    """The train and val tokens of cfg's corpus, tokenized on first use and read from the cache after."""
    validate(cfg)
    corpus = open_corpus(cfg)
    encoding = gpt2_encoding()
    key = _hash(
        {
            "format": FORMAT_VERSION,
            "tokenizer": [encoding.name, encoding.n_vocab],
            "corpus": corpus.fingerprint,
            "end_with_eot": corpus.end_with_eot,
            "shard_chars": cfg.shard_chars,
        }
    )
    folder = resolve_cache_dir(cfg) / f"{cfg.name}-{key[:16]}"
    manifest = _read_manifest(folder)
    reused = manifest is not None and manifest.get("complete", False) and _shards_intact(manifest, folder)
    if not reused:
        manifest = _tokenize(corpus, folder, cfg, key)
    splits = _splits(manifest, folder, cfg)
    verb = "using cached" if reused else "wrote"
    print(f"data: {verb} tokens {folder} ({len(splits['train']):,} train / {len(splits['val']):,} val tokens)")
    return splits


def load_split(cfg: DataConfig, split: str) -> TokenArray:
    """The tokens of one split, "train" or "val"."""
    if split not in SPLITS:
        raise PosGPTError(f"unknown data split {split!r}: use one of {', '.join(SPLITS)}")
    return load_splits(cfg)[split]


def _hash(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _read_manifest(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):  # missing or half-written: the entry is rebuilt from its shards
        return None


def _write_json(path: Path, value: dict) -> None:
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(value, indent=1))
    os.replace(temporary, path)


def _shards_intact(manifest: dict, folder: Path) -> bool:
    """Whether every shard the manifest lists is there with its length (someone may have deleted one)."""
    return all(
        (folder / shard["file"]).is_file() and (folder / shard["file"]).stat().st_size == 2 * shard["tokens"]
        for shards in manifest["shards"].values()
        for shard in shards
    )


def _splits(manifest: dict, folder: Path, cfg: DataConfig) -> dict[str, TokenArray]:
    """Train and val token arrays over the manifest's shards; PosGPTError if one of them is empty."""
    files = {stream: [folder / shard["file"] for shard in shards] for stream, shards in manifest["shards"].items()}
    if ALL in files:
        total = len(TokenArray(files[ALL]))
        cut = int(total * (1 - cfg.val_fraction))
        splits = {"train": TokenArray(files[ALL], 0, cut, "train"), "val": TokenArray(files[ALL], cut, total, "val")}
    else:
        splits = {split: TokenArray(files.get(split, []), name=split) for split in SPLITS}
    for split, tokens in splits.items():
        if len(tokens) == 0:
            raise PosGPTError(
                f"the {split} split of data {cfg.name!r} is empty: add documents, change data.val_fraction "
                "(or, for a hub dataset, set data.hub_val_split)"
            )
    return splits


def _tokenize(corpus: Corpus, folder: Path, cfg: DataConfig, key: str) -> dict:
    """Write every shard that is not there yet, then a complete manifest, which is returned."""
    folder.mkdir(parents=True, exist_ok=True)
    encoding = gpt2_encoding()
    assert encoding.n_vocab <= 2**16, "uint16 shards cannot hold this tokenizer's ids"
    manifest = {
        "key": key,
        "complete": False,
        "name": cfg.name,
        "source": cfg.source,
        "tokenizer": encoding.name,
        "n_vocab": encoding.n_vocab,
        "dtype": "uint16",
        "shards": {},
    }
    _write_json(folder / MANIFEST, manifest)  # says what this folder is while it is being filled

    print(f"data: tokenizing {cfg.name} into {folder}")
    with tqdm(total=corpus.n_documents, unit="doc", desc="tokenizing") as bar:

        def missing_shards() -> Iterator[tuple[Path, list[str], bool]]:
            for stream, index, docs in _group_into_shards(corpus.documents(), cfg.shard_chars):
                path = folder / f"{stream}_{index:06d}.bin"
                if path.exists():  # written by an earlier, interrupted run
                    bar.update(len(docs))
                else:
                    yield path, docs, corpus.end_with_eot

        for n_docs in _parallel_map(_write_shard, missing_shards(), cfg.num_proc):
            bar.update(n_docs)

    # Listing the folder finds the shards of earlier runs too; the key guarantees they belong here.
    for path in sorted(folder.glob("*_*.bin")):
        stream = path.name.split("_")[0]
        manifest["shards"].setdefault(stream, []).append({"file": path.name, "tokens": path.stat().st_size // 2})
    manifest["complete"] = True
    _write_json(folder / MANIFEST, manifest)
    return manifest


def _group_into_shards(documents: Documents, shard_chars: int) -> Iterator[tuple[str, int, list[str]]]:
    """(stream, index, documents) for consecutive documents of each label, about shard_chars characters each."""
    pending: dict[str, list[str]] = defaultdict(list)
    chars: dict[str, int] = defaultdict(int)
    count: dict[str, int] = defaultdict(int)
    for label, text in documents:
        pending[label].append(text)
        chars[label] += len(text)
        if chars[label] >= shard_chars:
            yield label, count[label], pending.pop(label)
            chars[label] = 0
            count[label] += 1
    for label, docs in pending.items():
        yield label, count[label], docs


def _write_shard(path: Path, docs: list[str], end_with_eot: bool) -> int:
    """Tokenize docs into one shard file; runs in a worker process. Returns the number of documents."""
    encoding = gpt2_encoding()
    suffix = [EOT_TOKEN] if end_with_eot else []
    tokens = np.concatenate([np.array(encoding.encode_ordinary(doc) + suffix, dtype=np.uint16) for doc in docs])
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tokens.tofile(temporary)
    os.replace(temporary, path)  # atomic: a shard file that exists is always whole
    return len(docs)


def _parallel_map(function: Callable, tasks: Iterable[tuple], num_proc: int) -> Iterator:
    """function(*task) for each task over num_proc processes, yielding results as they finish.

    At most 2 * num_proc tasks are in flight, so a streamed corpus is never held in memory whole
    (a plain Pool.imap would read all of it ahead).
    """
    if num_proc == 1:
        yield from (function(*task) for task in tasks)
        return
    with ProcessPoolExecutor(num_proc) as pool:
        running = set()
        for task in tasks:
            running.add(pool.submit(function, *task))
            if len(running) >= 2 * num_proc:
                finished, running = wait(running, return_when=FIRST_COMPLETED)
                yield from (future.result() for future in finished)
        yield from (future.result() for future in as_completed(running))
