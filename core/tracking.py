"""Where a run's numbers go: ``metrics.jsonl`` in the run directory and a Weights & Biases run.

W&B is offline by default (``logging.wandb.mode=offline``): the run is written under ``<run_dir>/wandb/``
and uploaded later with ``wandb sync <run_dir>/wandb/offline-run-*``. ``online`` logs live, ``disabled``
turns W&B off. The W&B run id is stored in checkpoints so that a resumed training run and a later
``eval.py`` write into the same W&B run.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import PosGPTError, first_line
from core.files import atomic_write, read_jsonl
from core.rundir import METRICS_FILE


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
            self.path.unlink(missing_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
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
        group=settings.group,
        name=settings.name,
        tags=list(settings.tags),
        job_type=job_type,
        config=settings.config,
        dir=str(run_dir),
        id=run_id,
        resume="allow" if run_id else None,
        settings=wandb.Settings(console="off", silent=True),
    )
