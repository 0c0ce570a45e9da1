"""Tokenize a corpus once into uint16 shard files, and find them again on later runs.

One cache entry, <cache_dir>/<name>-<key>/, holds:
    manifest.json         what the entry holds: each shard's file, token count and sha256; "complete" turns
                          true once every shard is written
    train_000000.bin ...  token ids as uint16, every document followed by <|endoftext|>
    val_000000.bin ...
    all_000000.bin ...    instead of train/val when the token stream is split (see sources.py)

The key hashes all that decides the tokens: the tokenizer, the documents and their split labels
(Corpus.fingerprint), whether documents end with <|endoftext|>, and the shard size. A shard is trusted only
if it matches the manifest: its size and the sha256 of its bytes are checked at every load (about 50 ms
for the 15M tokens of the default corpus). A shard that does not match, or a manifest that is not one, is
tokenized again; an interrupted run keeps the shards it finished (the manifest records each as it is
written), and the next one tokenizes only the rest.
"""

from core.interrupts import is_plain_ctrl_c

import contextlib
import hashlib
import json
import multiprocessing
import re
import signal
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, as_completed, wait
from pathlib import Path

import numpy as np
from tqdm import tqdm

from core.errors import MachineFault, PosGPTError
from core.files import atomic_write
from data.config import DataConfig, resolve_cache_dir, validate_data_config
from data.sources import ALL, Corpus, Documents, open_corpus
from data.tokenizer import EOT_TOKEN, GPT2_N_VOCAB, GPT2_NAME, gpt2_encoding
from data.tokens import TokenArray

FORMAT_VERSION = 2  # bump when the layout or the tokenization rules change, to leave old entries behind
MANIFEST = "manifest.json"
SPLITS = ("train", "val")
SHARD_NAME = re.compile(r"(train|val|all)_\d{6}\.bin")
# Settings that do not change which tokens a corpus holds (compared to tell whether eval scores the training corpus).
NOT_CONTENT = ("name", "cache_dir", "num_proc", "eval_split", "document_aware")


def load_splits(cfg: DataConfig, progress: bool = True) -> dict[str, TokenArray]:
    """The train and val tokens of cfg's corpus, tokenized on first use (a progress bar unless ``progress`` is
    false: logging.progress) and read from the cache after."""
    streams = _load(cfg, progress)
    return {split: _nonempty(streams[split], cfg) for split in SPLITS}


def load_split(cfg: DataConfig, split: str, progress: bool = True) -> TokenArray:
    """The tokens of one split: "train", "val", or "all" (the whole corpus, train then val)."""
    if split not in (*SPLITS, ALL):
        raise PosGPTError(f"unknown data split {split!r}: use one of {', '.join((*SPLITS, ALL))}")
    return _nonempty(_load(cfg, progress)[split], cfg)


def eval_tokens(
    cfg: DataConfig, trained_data: Mapping, trained_corpus: dict | None, progress: bool = True
) -> TokenArray:
    """The tokens eval.py scores, by data.eval_split; its .name is the split ("val", "train" or "all").

    auto: the val split of the corpus the run was trained on (its tokens match `trained_corpus`, the
    checkpoint's corpus_identity, or without one its settings match `trained_data`), all of any other
    corpus. The training corpus's sources with other tokens (edited since, or another data.val_fraction)
    are refused under auto: their val split may hold text the run trained on.
    """
    streams = _load(cfg, progress)
    split = cfg.eval_split
    if split == "auto":
        if trained_corpus is not None:
            same = corpus_identity({s: streams[s] for s in SPLITS}) == trained_corpus
        else:
            same = _content_settings(cfg) == _content_settings(trained_data)
        ignored = ("val_fraction", "shard_chars")
        if not same and _content_settings(cfg, ignored) == _content_settings(trained_data, ignored):
            raise PosGPTError(
                f"data {cfg.name!r} ({describe_corpus(cfg)}) is what this run was trained on, but its tokens or "
                "split differ from the checkpoint's (edited since, or another data.val_fraction), so its val split "
                "may hold training text: pass data.eval_split=val|train|all to choose what to score"
            )
        split = "val" if same else ALL
        which = "the corpus the run was trained on" if same else "not the corpus the run was trained on"
        print(f"data: data.eval_split=auto: scoring the {split} split of {cfg.name} ({which})", flush=True)
    return _nonempty(streams[split], cfg)


def corpus_identity(splits: Mapping[str, TokenArray]) -> dict:
    """What a run trains on, by content: each split's token count and a digest of its shards' sha256s.

    Cheap (the checksums are the manifest's, verified at load); the training loop stores it in every
    checkpoint and a resumed run must match it (check_corpus).
    """
    return {split: {"tokens": len(tokens), "digest": tokens.digest} for split, tokens in sorted(splits.items())}


def check_corpus(recorded: dict | None, splits: Mapping[str, TokenArray], cfg: DataConfig) -> None:
    """PosGPTError naming the corpus if `splits` are not the tokens `recorded` (a checkpoint's corpus_identity).

    None (a checkpoint from before identities were recorded) is accepted.
    """
    now = corpus_identity(splits)
    if recorded is None or recorded == now:
        return
    changed = [split for split in sorted(now.keys() | recorded.keys()) if now.get(split) != recorded.get(split)]
    shown = "; ".join(
        f"{split}: {_summary(recorded.get(split))} in the checkpoint, {_summary(now.get(split))} now"
        for split in changed
    )
    raise PosGPTError(
        f"data {cfg.name!r} ({describe_corpus(cfg)}) holds other tokens than the checkpoint was trained on ({shown}). "
        "Restore that corpus to resume, or start a new run in another hydra.run.dir"
    )


def describe_corpus(cfg: DataConfig) -> str:
    """Where a corpus comes from, in a few words: its files, its hub dataset, or the standard library."""
    if cfg.source == "text":
        return "files " + ", ".join(cfg.files)
    if cfg.source == "hub":
        return f"hub {cfg.hub_path}" + (f" ({cfg.hub_name})" if cfg.hub_name else "")
    return "the standard library of this Python"


def _summary(identity: dict | None) -> str:
    return "nothing" if identity is None else f"{identity['tokens']:,} tokens, digest {str(identity['digest'])[:12]}"


def _content_settings(data: Mapping | DataConfig, ignored: tuple[str, ...] = ()) -> dict:
    """The data settings that decide which tokens a corpus holds (all but NOT_CONTENT and `ignored`)."""
    values = data if isinstance(data, Mapping) else vars(data)
    return {key: _plain(values[key]) for key in values if key not in NOT_CONTENT + ignored}


def _plain(value: object) -> object:
    """Lists and tuples, including OmegaConf's ListConfig, as plain lists (to compare them)."""
    return list(value) if not isinstance(value, (str, bytes, Mapping)) and isinstance(value, Iterable) else value


def _load(cfg: DataConfig, progress: bool = True) -> dict[str, TokenArray]:
    """train, val and all (both) of cfg's corpus, tokenizing what the cache lacks or what fails its checks."""
    validate_data_config(cfg)
    corpus = open_corpus(cfg)
    key = _hash(
        {
            "format": FORMAT_VERSION,
            "tokenizer": [GPT2_NAME, GPT2_N_VOCAB],
            "corpus": corpus.fingerprint,
            "end_with_eot": corpus.end_with_eot,
            "shard_chars": cfg.shard_chars,
        }
    )
    folder = resolve_cache_dir(cfg) / f"{cfg.name}-{key[:16]}"
    manifest = _read_manifest(folder, key)
    listed = [shard for shards in manifest["shards"].values() for shard in shards] if manifest else []
    trusted = {shard["file"]: shard for shard in listed if _shard_matches(folder, shard)}
    reused = manifest is not None and manifest["complete"] and len(trusted) == len(listed)
    if not reused:
        if manifest is not None and manifest["complete"]:
            bad = sorted(shard["file"] for shard in listed if shard["file"] not in trusted)
            print(
                f"data: {len(bad)} shard(s) of {folder} do not match the manifest ({', '.join(bad[:3])}"
                f"{', ...' if len(bad) > 3 else ''}): tokenizing them again",
                flush=True,
            )
        try:
            manifest = _tokenize(corpus, folder, cfg, key, trusted, progress)
        except (OSError, MachineFault) as e:  # a full disk, a missing permission
            reason = e.strerror if isinstance(e, OSError) and e.strerror else e
            raise MachineFault(
                f"cannot write the token cache {folder} ({reason}): free space or fix its permissions, or delete it "
                f"(rm -r {folder}) or set data.cache_dir to another folder"
            ) from None
    streams = _streams(manifest, folder, cfg.val_fraction)
    verb = "using cached" if reused else "wrote"
    print(f"data: {verb} tokens {folder} ({len(streams['train']):,} train / {len(streams['val']):,} val tokens)")
    return streams


def _hash(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _read_manifest(folder: Path, key: str) -> dict | None:
    """The entry's manifest if it is one of this key's; None, saying why when it exists, otherwise."""
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:  # half-written, damaged, unreadable
        print(f"data: {path} is not readable JSON ({e}): tokenizing the entry again", flush=True)
        return None
    problem = _manifest_problem(manifest, key)
    if problem:
        print(f"data: {path} is not a valid manifest ({problem}): tokenizing the entry again", flush=True)
        return None
    return manifest


def _manifest_problem(manifest: object, key: str) -> str | None:
    """What is wrong with the shape of a manifest, or None."""
    if not isinstance(manifest, dict):
        return f"a {type(manifest).__name__}, not an object"
    if manifest.get("key") != key:
        return "another cache key"
    if not isinstance(manifest.get("complete"), bool):
        return "no 'complete' flag"
    shards = manifest.get("shards")
    if not isinstance(shards, dict) or not all(isinstance(v, list) for v in shards.values()):
        return "'shards' is not an object of lists"
    if manifest["complete"] and not any(shards.values()):
        return "complete, but lists no shards"
    for stream, entries in shards.items():
        for shard in entries:
            if not (
                isinstance(shard, dict)
                and isinstance(shard.get("file"), str)
                and SHARD_NAME.fullmatch(shard["file"])
                and shard["file"].startswith(f"{stream}_")
                and isinstance(shard.get("tokens"), int)
                and isinstance(shard.get("sha256"), str)
            ):
                return f"a malformed shard entry in {stream!r}: {str(shard)[:80]}"
    return None


def _write_json(path: Path, value: dict) -> None:
    atomic_write(path, json.dumps(value, indent=1))


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def _shard_matches(folder: Path, shard: dict) -> bool:
    """Whether a shard file holds what the manifest recorded: its token count, then its sha256."""
    path = folder / shard["file"]
    try:
        return path.stat().st_size == 2 * shard["tokens"] and _sha256_file(path) == shard["sha256"]
    except OSError:  # missing or unreadable
        return False


def _streams(manifest: dict, folder: Path, val_fraction: float) -> dict[str, TokenArray]:
    """train, val and all token arrays over the manifest's shards (possibly empty)."""
    shards = {stream: sorted(entries, key=lambda s: s["file"]) for stream, entries in manifest["shards"].items()}

    def array(entries: list[dict], name: str, start: int = 0, stop: int | None = None) -> TokenArray:
        return TokenArray([folder / s["file"] for s in entries], start, stop, name, [s["sha256"] for s in entries])

    if ALL in shards:
        total = sum(s["tokens"] for s in shards[ALL])
        cut = int(total * (1 - val_fraction))
        return {
            "train": array(shards[ALL], "train", 0, cut),
            "val": array(shards[ALL], "val", cut, total),
            ALL: array(shards[ALL], ALL),
        }
    train, val = shards.get("train", []), shards.get("val", [])
    return {"train": array(train, "train"), "val": array(val, "val"), ALL: array(train + val, ALL)}


def _nonempty(tokens: TokenArray, cfg: DataConfig) -> TokenArray:
    if len(tokens) == 0:
        raise PosGPTError(
            f"the {tokens.name} split of data {cfg.name!r} is empty: add documents, change data.val_fraction "
            "(or, for a hub dataset, set data.hub_val_split)"
        )
    return tokens


def _tokenize(
    corpus: Corpus, folder: Path, cfg: DataConfig, key: str, trusted: dict[str, dict], progress: bool = True
) -> dict:
    """Write every shard not in `trusted` (shards already checked against their record), recording each in
    the manifest as it is written; then mark the manifest complete and return it."""
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

    def record(stream: str, shard: dict) -> None:
        manifest["shards"].setdefault(stream, []).append(shard)
        _write_json(folder / MANIFEST, manifest)  # an interrupted run keeps what it finished

    _write_json(folder / MANIFEST, manifest)
    print(f"data: tokenizing {cfg.name} into {folder}", flush=True)
    with tqdm(total=corpus.n_documents, unit="doc", desc="tokenizing", disable=not progress) as bar:

        def missing_shards() -> Iterator[tuple[Path, list[str], bool]]:
            for stream, index, docs in _group_into_shards(corpus.documents(), cfg.shard_chars):
                name = f"{stream}_{index:06d}.bin"
                if name in trusted:  # written by an earlier run, and still what it recorded
                    record(stream, trusted[name])
                    bar.update(len(docs))
                else:
                    yield folder / name, docs, corpus.end_with_eot

        with (
            _signals_stop_workers() as check_signals,
            contextlib.closing(_parallel_map(_write_shard, missing_shards(), cfg.num_proc)) as results,
        ):
            for name, n_docs, tokens, sha256 in results:
                check_signals()
                record(name.split("_")[0], {"file": name, "tokens": tokens, "sha256": sha256})
                bar.update(n_docs)

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


def _write_shard(path: Path, docs: list[str], end_with_eot: bool) -> tuple[str, int, int, str]:
    """Tokenize docs into one shard file; runs in a worker process. Returns the file's name, the number of
    documents and of tokens, and the sha256 of the file's bytes."""
    encoding = gpt2_encoding()
    suffix = [EOT_TOKEN] if end_with_eot else []
    tokens = np.concatenate([np.array(encoding.encode_ordinary(doc) + suffix, dtype=np.uint16) for doc in docs])
    atomic_write(path, tokens.tofile)  # a shard file that exists is always whole
    return path.name, len(docs), len(tokens), hashlib.sha256(tokens.tobytes()).hexdigest()


class _Terminated(BaseException):
    """SIGTERM arrived while workers were tokenizing (BaseException: no `except Exception` swallows it)."""


@contextlib.contextmanager
def _signals_stop_workers() -> Iterator[Callable[[], None]]:
    """Make SIGTERM unwind like Ctrl-C, so that the worker pool is stopped (_parallel_map), then deliver it
    again with its previous handler: the process ends as it would have, without orphans left tokenizing.

    Yields a check to call between results: Python ignores an exception raised by a handler that runs inside
    some callbacks (a fork hook of the pool starting a worker), so each signal is also remembered. Ctrl-C
    raises KeyboardInterrupt as usual, and is remembered the same way.
    """
    received: list[int] = []

    def interrupt(signum: int) -> None:
        raise KeyboardInterrupt if signum == signal.SIGINT else _Terminated

    def handle(signum: int, frame) -> None:
        received.append(signum)
        interrupt(signum)

    def check() -> None:
        if received:
            interrupt(received[0])

    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread
        yield check
        return
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, handle)}
    if is_plain_ctrl_c(signal.getsignal(signal.SIGINT)):  # leave a custom or ignored Ctrl-C alone
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, handle)
    try:
        yield check
        check()  # one that came after the last result, its exception swallowed where it was raised: deliver it now
    except _Terminated:
        signal.signal(signal.SIGTERM, previous[signal.SIGTERM])
        signal.raise_signal(signal.SIGTERM)
        raise  # only reached if the previous handler returns
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _worker_signals() -> None:
    """A forked worker inherits _signals_stop_workers' handlers: it drops them, and leaves Ctrl-C to the main
    process, which stops it (no traceback from each worker)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _parallel_map(function: Callable, tasks: Iterable[tuple], num_proc: int) -> Iterator:
    """function(*task) for each task over num_proc processes, yielding results as they finish.

    At most 2 * num_proc tasks are in flight, so a streamed corpus is never held in memory whole
    (a plain Pool.imap would read all of it ahead). If the caller stops early (an error, Ctrl-C, SIGTERM
    under _signals_stop_workers), the workers are killed rather than left to finish their tasks.
    """
    if num_proc == 1:
        yield from (function(*task) for task in tasks)
        return
    before = set(multiprocessing.active_children())
    pool = ProcessPoolExecutor(num_proc, initializer=_worker_signals)
    try:
        running = set()
        for task in tasks:
            running.add(pool.submit(function, *task))
            if len(running) >= 2 * num_proc:
                finished, running = wait(running, return_when=FIRST_COMPLETED)
                yield from (future.result() for future in finished)
        yield from (future.result() for future in as_completed(running))
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        for worker in set(multiprocessing.active_children()) - before:  # this pool's workers
            worker.kill()  # SIGKILL: no handler runs (a worker may not have reset the inherited ones yet)
            worker.join()
        raise
    pool.shutdown()
