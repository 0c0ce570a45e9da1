"""Look inside a trained run's attention: by query-key distance and by entropy, at 1x and past the training length.

    python scripts/inspect_attention.py run_dir=outputs/2026-11-22/10-00-00-alibi
    python scripts/inspect_attention.py run_dir=... inspect.length_multipliers=[1,4,16] inspect.windows=8
    python scripts/inspect_attention.py run_dir=<rope run> pe.scaling.type=yarn pe.scaling.factor=8

For every layer and head, on ``inspect.windows`` consecutive windows of the validation split at each of
``inspect.length_multipliers`` x train.seq_len (default 1x and 8x): the mean attention weight by query-key
distance (log-spaced bins) and the attention entropy by query position (see evaluation/attention_stats.py for
the definitions). The run's config is recomposed as eval.py does it, with the same refusals. Written to
<run_dir>/eval/ (the suffix names the scheme's evaluation-time variation, e.g. ``_yarn-8`` for pe.scaling):

    attention{suffix}.json            {"pe", "train_seq_len", "step", "variation", "data", "n_layer", "n_head",
                                       "lengths": [one entry per length, see below]}
    attention_distance{suffix}.png    mean weight vs distance: a row per layer, a column per length, a line per head
    attention_entropy{suffix}.png     entropy vs position, laid out the same, with ln(i+1) (uniform) dotted

Each "lengths" entry: {"length", "windows", "reason": null, "distance_bins": [[lo, hi), ...] of distances,
"mean_weight": [layer][head][distance bin], "mean_distance": [layer][head], "position_bins": [[lo, hi), ...]
of 1-based positions, "entropy": [layer][head][position bin] (nats), "uniform_entropy": [position bin],
"attended_mass": [layer][head][position bin] (1 for a softmax; entropy and mean distance are those of rows
normalised to 1)}; a length the scheme cannot encode (pe=learned past its table) or the split cannot fill is
{"length", "windows": 0, "reason"}. The plots also go to the run's W&B run. Like eval.py, it holds the run
directory's lock while it runs (core/rundir.py).

It plans, then writes: under the lock, the run is loaded and every setting checked, each output is checked to be
one this command may write (core.files: not another run's files, a folder it can write) and so is W&B's folder
with its login (core.tracking.check_wandb); then the statistics are computed, and only once every length is
known W&B starts and the files are written. A refused command leaves the run directory as it was.
"""

from __future__ import annotations

import _repo

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from core.cli import exit_on_user_error
from core.errors import PosGPTError
from core.files import atomic_write, check_matplotlib_folders, check_outputs, check_writable
from core.rundir import CHECKPOINT_DIR, EVAL_DIR, lock_run
from core.tracking import TrackerSettings, check_wandb, init_wandb
from data import TokenArray, eval_tokens
from evaluation.attention_stats import ATTENTION_FILE, attention_statistics, plot_distance, plot_entropy
from experiment.build import load_trained_run, parse_run_dir, require_text_run
from experiment.config import InspectConfig
from experiment.plan import tracker_settings
from model import GPT

USAGE = "usage: python scripts/inspect_attention.py run_dir=<training run directory> [inspect.* and other overrides]"


def output_suffix(variation: str) -> str:
    """'' for the scheme as trained, else its variation's label made safe for file names (yarn:8 -> _yarn-8)."""
    return "_" + re.sub(r"[^A-Za-z0-9.=]+", "-", variation).strip("-") if variation else ""


@dataclass(frozen=True)
class Inspection:
    """What an inspection reads and where it writes, all checked before anything is computed or written: the model
    (weights loaded, in eval mode, the scheme's evaluation-time variation set) and where it runs, the validation
    tokens, the lengths and the inspect.* settings; what the document records of the run (its scheme and variation,
    training length, the checkpoint's step, the corpus's name); the outputs; and the W&B run it continues."""

    run_dir: Path
    model: GPT
    device: torch.device
    dtype: torch.dtype
    tokens: TokenArray
    lengths: tuple[int, ...]
    settings: InspectConfig
    pe_name: str
    variation: str | None  # None for the scheme as trained
    train_seq_len: int
    step: int
    data_name: str
    suffix: str  # the variation's, in every output's name
    paths: dict[str, Path]  # "json", "distance", "entropy" -> the file under <run_dir>/eval/
    tracker: TrackerSettings
    wandb_run_id: str | None


@exit_on_user_error
def main(argv: list[str]) -> None:
    run_dir, overrides = parse_run_dir(argv, USAGE)
    with lock_run(run_dir):
        inspect_run(plan_inspection(run_dir, overrides))


def plan_inspection(run_dir: Path, overrides: list[str]) -> Inspection:
    """Load the run with ``overrides`` and check everything the inspection will need, writing nothing: the settings
    (as eval.py checks them), its outputs (not another run's files, writable) and its W&B run."""
    run = load_trained_run(run_dir, overrides, "scripts/inspect_attention.py")
    require_text_run(run, "inspecting its attention on text")
    cfg = run.cfg
    multipliers = list(cfg.inspect.length_multipliers)
    if not multipliers:
        raise PosGPTError("inspect.length_multipliers must name at least one length")
    suffix = output_suffix(run.model.pe.current_variation())
    eval_dir = Path(run.dir) / EVAL_DIR
    paths = {
        "json": eval_dir / ATTENTION_FILE.replace(".json", f"{suffix}.json"),
        "distance": eval_dir / f"attention_distance{suffix}.png",
        "entropy": eval_dir / f"attention_entropy{suffix}.png",
    }
    outputs = {f"the {name} output": path for name, path in paths.items()}
    check_outputs(outputs, inputs=[run.dir / CHECKPOINT_DIR], run=run.dir)
    check_writable(outputs)
    check_matplotlib_folders()
    tracker = tracker_settings(cfg)
    check_wandb(tracker, run.dir)
    lengths = sorted({m * cfg.train.seq_len for m in multipliers})
    reasons = [run.model.pe.beyond_reach(length) for length in lengths]
    if all(reasons):  # what the scheme alone refuses is refused before the data is read
        raise PosGPTError(f"no length could be inspected: {reasons[0]}")
    checkpoint = run.checkpoint
    data = OmegaConf.to_object(cfg.data)
    tokens = eval_tokens(data, checkpoint["config"]["data"], checkpoint.get("corpus"), cfg.logging.progress)
    return Inspection(
        run_dir=run.dir,
        model=run.model,
        device=run.device,
        dtype=run.dtype,
        tokens=tokens,
        lengths=tuple(lengths),
        settings=OmegaConf.to_object(cfg.inspect),
        pe_name=cfg.pe.name,
        variation=run.model.pe.current_variation() or None,
        train_seq_len=cfg.train.seq_len,
        step=checkpoint["step"],
        data_name=cfg.data.name,
        suffix=suffix,
        paths=paths,
        tracker=tracker,
        wandb_run_id=checkpoint.get("wandb_run_id"),
    )


def inspect_run(plan: Inspection) -> None:
    """Compute the statistics at every length, then start W&B, write the files and log the plots."""
    entries = []
    for length in plan.lengths:
        windows = plan.settings.windows
        entries.append(attention_statistics(plan.model, plan.tokens, length, windows, plan.device, plan.dtype))
        done = entries[-1]
        print(
            f"inspect: length {length}: "
            + (f"{done['windows']} windows" if done["reason"] is None else f"skipped ({done['reason']})"),
            flush=True,
        )
    if all(entry["reason"] is not None for entry in entries):
        raise PosGPTError(f"no length could be inspected: {entries[0]['reason']}")
    document = {
        "pe": plan.pe_name,
        "train_seq_len": plan.train_seq_len,
        "step": plan.step,
        "variation": plan.variation,
        "data": plan.data_name,
        "n_layer": plan.model.cfg.n_layer,
        "n_head": plan.model.cfg.n_head,
        "lengths": entries,
    }
    wandb_run = init_wandb(plan.tracker, plan.run_dir, plan.wandb_run_id, job_type="inspect")
    plan.paths["json"].parent.mkdir(parents=True, exist_ok=True)
    atomic_write(plan.paths["json"], json.dumps(document, indent=1) + "\n")
    plot_distance(document, plan.paths["distance"])
    plot_entropy(document, plan.paths["entropy"])
    print(f"inspect: wrote {', '.join(str(p) for p in plan.paths.values())}", flush=True)
    if wandb_run is not None:
        import wandb

        names = ("distance", "entropy")
        wandb_run.log({f"attention/{name}{plan.suffix}": wandb.Image(str(plan.paths[name])) for name in names})
        wandb_run.finish()


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main(sys.argv[1:])
