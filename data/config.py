"""The typed schema of the `data` config group, and the checks that run before any data is read."""

import os
from dataclasses import dataclass
from pathlib import Path

from core.domain import check_domains, choice, domain, read_with
from core.errors import PosGPTError
from core.paths import bad_path

SOURCES = ("python_stdlib", "text", "hub")
EVAL_SPLITS = ("auto", "val", "train", "all")  # data.eval_split
MAX_NAME_BYTES = 200  # data.name, with the cache key, must fit a file name (255 bytes)

# datasets' packaged loader for each kind of local or remote file.
LOADERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
# Which data.source reads a key (core.domain's used_with): any other source would ignore it.
_TEXT, _HUB, _FILES_OR_HUB = ("source", ("text",)), ("source", ("hub",)), ("source", ("text", "hub"))


@dataclass
class DataConfig:
    """Where the training text comes from and how it is split; configs/data/*.yaml set these values.

    The defaults describe the corpus every machine has without a download: the .py files of the
    running Python's standard library.
    """

    name: str = "python_stdlib"  # names the token cache folder; not part of the cache key
    source: str = choice("python_stdlib", SOURCES)

    # source=text: local paths or http(s) URLs; one .txt file is one document, .jsonl/.json/.parquet hold one per row
    files: list[str] = read_with(default_factory=list, used_with=_TEXT)
    text_field: str = read_with("text", used_with=_FILES_OR_HUB)  # the text's column: json/parquet files, hub datasets

    # source=hub: a dataset on the Hugging Face Hub
    hub_path: str | None = read_with(None, used_with=_HUB)
    hub_name: str | None = read_with(None, used_with=_HUB)
    hub_split: str = read_with("train", used_with=_HUB)
    hub_val_split: str | None = read_with(None, used_with=_HUB)  # the dataset's own val split; None: by document hash
    streaming: bool = read_with(False, used_with=_HUB)  # read the hub dataset as a stream, not downloaded whole first
    max_documents: int | None = domain(None, ge=1, used_with=_HUB)  # read at most this many documents a hub split

    # False for datasets whose rows are lines of one running text (wikitext): rows are then joined
    # instead of each being ended by <|endoftext|>. Give such data a hub_val_split, or its lines get split.
    rows_are_documents: bool = read_with(True, used_with=_FILES_OR_HUB)

    # Share of documents (picked by a stable hash) that go to the validation split; when a local corpus
    # is too small for that to fill both splits (one book), the share of its tokens taken from the end.
    val_fraction: float = domain(0.01, gt=0, lt=1)
    # What eval.py scores: auto = the val split of the corpus the run was trained on, all of any other
    # corpus; or val | train | all (the whole corpus, up to eval.max_tokens). Training ignores it.
    eval_split: str = choice("auto", EVAL_SPLITS)
    cache_dir: str | None = None  # None: $POSGPT_CACHE_DIR, else ~/.cache/posgpt
    # Training only: positions restart at 0 after each <|endoftext|> of a training window, and attention does not
    # cross it (data/windows.py separate_documents, model/documents.py). Validation and evaluation score the stream.
    document_aware: bool = read_with(False, commands=("train",))
    num_proc: int = domain(2, ge=1)  # processes that tokenize in parallel
    shard_chars: int = domain(8_000_000, ge=1)  # characters of text per token shard (~2M tokens, 4 MB)

    def check_training(self, drawn_positions: str | None) -> None:
        """PosGPTError where data.document_aware, which only training reads, cannot train: its windows need documents
        to keep apart, and each document gets positions of its own, so ``drawn_positions`` (the train.* setting that
        draws a window's positions, where one is set) cannot be used with it."""
        if not self.document_aware:
            return
        if drawn_positions is not None:
            raise PosGPTError(
                f"data.document_aware restarts positions at each document, {drawn_positions} draws one set per "
                "window: use one of them"
            )
        if not self.rows_are_documents:
            raise PosGPTError(
                f"data.document_aware needs documents ended by <|endoftext|>; data.rows_are_documents=false joins the "
                f"rows of {self.name} into one text: drop data.document_aware"
            )


def resolve_cache_dir(cfg: DataConfig) -> Path:
    """The folder holding token caches: cfg.cache_dir, else $POSGPT_CACHE_DIR, else ~/.cache/posgpt."""
    chosen = cfg.cache_dir or os.environ.get("POSGPT_CACHE_DIR") or "~/.cache/posgpt"
    return Path(chosen).expanduser()


def is_url(path: str) -> bool:
    return path.startswith(("http://", "https://"))


def loader_for(path: str) -> str:
    """The datasets packaged loader ("text", "json" or "parquet") for a file, from its extension."""
    suffix = Path(path.split("?")[0]).suffix.lower()
    if suffix not in LOADERS:
        raise PosGPTError(f"data.files: cannot read {path!r}: use one of the extensions {', '.join(sorted(LOADERS))}")
    return LOADERS[suffix]


def _check_local_file(path: str) -> None:
    file = Path(path).expanduser()
    if not file.is_file():
        raise PosGPTError(f"data.files: {path} does not exist or is not a file; fix the path in data.files")
    try:
        with file.open("rb") as f:
            empty = not f.read(1)
    except OSError as e:
        raise PosGPTError(f"data.files: cannot read {path} ({e.strerror}); fix its permissions or drop it") from None
    if empty:
        raise PosGPTError(f"data.files: {path} is empty; drop it from data.files")


def _check_reachable(cache: Path) -> None:
    """A cache folder behind a loop of symbolic links or a name too long is a mistake in the command, said at
    start-up: when the token cache is written it would read as a fault of the machine (exit 74)."""
    try:
        cache.stat()
    except (FileNotFoundError, NotADirectoryError):  # made when written; a path through a file is said below
        pass
    except OSError as error:
        if bad_path(error) is None:
            raise
        raise PosGPTError(f"data.cache_dir (or $POSGPT_CACHE_DIR) {cache}: {bad_path(error)}") from None


def validate_data_config(cfg: DataConfig) -> None:
    """Raise PosGPTError, naming the setting to change, if cfg cannot describe a corpus (each key's domain is
    checked with the whole config: experiment/config.py; again here, where data/ runs without it)."""
    check_domains(cfg, "data.")
    # data.name names the token cache's folder, <cache_dir>/<name>-<key>: one folder name, never a path out of it.
    if "/" in cfg.name or "\0" in cfg.name or cfg.name in (".", "..") or len(cfg.name.encode()) > MAX_NAME_BYTES:
        shown = cfg.name if len(cfg.name) <= 60 else f"{cfg.name[:40]}... ({len(cfg.name)} characters)"
        raise PosGPTError(
            f"data.name={shown!r} names the token cache's folder: give a name of at most {MAX_NAME_BYTES} bytes "
            "without '/', not '.' or '..'"
        )
    cache = resolve_cache_dir(cfg)
    _check_reachable(cache)
    blocking = next((path for path in (cache, *cache.parents) if path.exists() and not path.is_dir()), None)
    if blocking is not None:  # a mistake in the command, not a fault of the machine when the cache is written
        raise PosGPTError(
            f"data.cache_dir (or $POSGPT_CACHE_DIR) {cache}: {blocking} is a file, not a folder; choose a folder"
        )
    if cfg.source == "text":
        if not cfg.files:
            raise PosGPTError("data.source=text needs files: set data.files=[path/to/a.txt,...]")
        for path in cfg.files:
            loader_for(path)
            if not is_url(path):
                _check_local_file(path)
    if cfg.source == "hub":
        if not cfg.hub_path:
            raise PosGPTError("data.source=hub needs data.hub_path, e.g. data.hub_path=roneneldan/TinyStories")
