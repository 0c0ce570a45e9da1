"""Where a run's numbers go: ``metrics.jsonl`` in the run directory and a Weights & Biases run.

W&B is offline by default (``logging.wandb.mode=offline``): the run is written under ``<run_dir>/wandb/``
and uploaded later with ``wandb sync <run_dir>/wandb/offline-run-*``. ``online`` logs live, ``disabled``
turns W&B off. The W&B run id is stored in checkpoints so that a resumed training run and a later
``eval.py`` write into the same W&B run.

:func:`check_wandb` checks, before a command writes anything, what would make :func:`init_wandb` fail: online
without a login on this machine (looked up as W&B looks it up, without the network), and a ``<run_dir>/wandb``
that cannot be a folder this process writes (a stray file of that name, a read-only run directory). A command
calls it where it checks its other outputs, and calls init_wandb once nothing is left to refuse: W&B writes its
files as it starts.
"""

from __future__ import annotations

import json
import math
import netrc
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from core.errors import PosGPTError, first_line
from core.files import atomic_write, check_folder, open_append, read_jsonl, remove
from core.rundir import METRICS_FILE, WANDB_DIR
from core.text import printable

WANDB_MODES = ("online", "offline", "disabled")
WANDB_HOST = "https://api.wandb.ai"  # W&B's own server, where WANDB_BASE_URL names no other


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf
    return value


def _records(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics file; a last line torn by a kill -9 mid-write is dropped (so is a line that is not
    UTF-8 JSON: the file may have been damaged by hand)."""
    records = []
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


class MetricsFile:
    """Appends one JSON object per logged step to ``<run_dir>/metrics.jsonl``."""

    def __init__(self, run_dir: str | Path, resume_step: int | None = None) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        if resume_step is not None and self.path.exists():
            # Drop what a stopped run logged after its last checkpoint: the resumed run logs it again.
            kept = [record for record in _records(self.path) if record["step"] <= resume_step]
            atomic_write(self.path, "".join(json.dumps(record) + "\n" for record in kept))
        elif resume_step is None:
            remove(self.path)

    def write(self, record: dict[str, Any]) -> None:
        with open_append(self.path) as f:
            f.write(json.dumps({k: _jsonable(v) for k, v in record.items()}) + "\n")


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's metrics records, for a report: a damaged file (a torn last line included) is a PosGPTError naming
    it, never read as if whole (a resuming run drops a torn line itself: MetricsFile)."""
    return read_jsonl(Path(run_dir) / METRICS_FILE) or []


@dataclass(frozen=True)
class TrackerSettings:
    """What the W&B run is started with: ``logging.wandb.*``, the tags (with the run's ``pe=<scheme>``) and the
    run's resolved config, which the W&B run records (experiment/plan.py builds it)."""

    mode: str
    project: str | None = None
    entity: str | None = None
    group: str | None = None
    name: str | None = None
    tags: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict, repr=False)


def wandb_login() -> str | None:
    """Where W&B would find this machine's login, or None where there is none: WANDB_API_KEY or
    WANDB_IDENTITY_TOKEN_FILE, else an entry for the W&B host (WANDB_BASE_URL's) in the netrc file (NETRC, else
    ~/.netrc) that ``wandb login`` writes. Read from the environment and the file alone: no network, no write."""
    for variable in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        if os.environ.get(variable):
            return variable
    path = Path(os.environ.get("NETRC") or "~/.netrc").expanduser()
    try:
        entry = netrc.netrc(path).authenticators(urlsplit(os.environ.get("WANDB_BASE_URL") or WANDB_HOST).netloc)
    except (OSError, netrc.NetrcParseError):  # no file, or one W&B could not read either
        return None
    return str(path) if entry is not None and entry[2] else None


def check_wandb(settings: TrackerSettings, run_dir: str | Path) -> None:
    """Refuse, before anything is written, a W&B run that :func:`init_wandb` could not start in ``run_dir``: a
    mode that is not one of WANDB_MODES, online mode with no login on this machine (:func:`wandb_login`), and a
    ``<run_dir>/wandb`` that cannot hold W&B's files (core.files.check_folder: a file of that name, a folder this
    process may not write). Disabled W&B writes nothing and is not checked further."""
    if settings.mode not in WANDB_MODES:
        raise PosGPTError(f"logging.wandb.mode={settings.mode} is not one of {', '.join(WANDB_MODES)}")
    if settings.mode == "disabled":
        return
    if settings.mode == "online" and wandb_login() is None:
        raise PosGPTError(
            "logging.wandb.mode=online: this machine has no W&B login (no WANDB_API_KEY, no entry in ~/.netrc); "
            "log in (`wandb login`, or WANDB_API_KEY), or log offline (logging.wandb.mode=offline, the default) "
            "and `wandb sync` later (nothing was written)"
        )
    check_folder(f"logging.wandb.mode={settings.mode}: W&B's folder", Path(run_dir) / WANDB_DIR)


def init_wandb(settings: TrackerSettings, run_dir: str | Path, run_id: str | None, job_type: str = "train"):
    """Start (or resume, when run_id is given) the W&B run; returns None when W&B is disabled."""
    if settings.mode == "disabled":
        return None
    import wandb

    os.environ.setdefault("WANDB_SILENT", "true")
    try:
        return _start_wandb(wandb, settings, run_dir, run_id, job_type)
    except (wandb.errors.UsageError, wandb.errors.AuthenticationError, wandb.errors.CommError) as error:
        # Online with no login, a bad key or no network: before, W&B's traceback, and the run never started.
        raise PosGPTError(
            f"logging.wandb.mode={settings.mode}: W&B could not start ({first_line(error)}); log in (`wandb login`, "
            "or WANDB_API_KEY), or log offline (logging.wandb.mode=offline, the default) and `wandb sync` later"
        ) from None


def _start_wandb(wandb, settings: TrackerSettings, run_dir: str | Path, run_id: str | None, job_type: str):
    return wandb.init(
        mode=settings.mode,
        project=settings.project,
        entity=settings.entity,
        group=None if settings.group is None else printable(settings.group),  # a study's folder name, say
        name=None if settings.name is None else printable(settings.name),
        tags=[printable(tag) for tag in settings.tags],
        job_type=job_type,
        config=settings.config,
        dir=str(run_dir),
        id=run_id,
        resume="allow" if run_id else None,
        settings=wandb.Settings(console="off", silent=True),
    )
