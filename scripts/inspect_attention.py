"""Look inside a trained run's attention: by query-key distance and by entropy, at 1x and past the training length.

    python scripts/inspect_attention.py run_dir=outputs/2026-11-22/10-00-00-alibi
    python scripts/inspect_attention.py run_dir=... inspect.length_multipliers=[1,4,16] inspect.windows=8
    python scripts/inspect_attention.py run_dir=<rope run> pe.scaling.type=yarn pe.scaling.factor=8

For every layer and head, on ``inspect.windows`` consecutive windows of the validation split at each of
``inspect.length_multipliers`` x train.seq_len (default 1x and 8x): the mean attention weight by query-key
distance (log-spaced bins) and the attention entropy by query position (see evaluation/attention_stats.py for
the definitions). The run's config is recomposed as eval.py does it, with the same refusals. Written to
<run_dir>/eval/ (the suffix names a pe.scaling other than none, e.g. ``_yarn-8``):

    attention{suffix}.json            {"pe", "train_seq_len", "step", "scaling", "data", "n_layer", "n_head",
                                       "lengths": [one entry per length, see below]}
    attention_distance{suffix}.png    mean weight vs distance: a row per layer, a column per length, a line per head
    attention_entropy{suffix}.png     entropy vs position, laid out the same, with ln(i+1) (uniform) dotted

Each "lengths" entry: {"length", "windows", "reason": null, "distance_bins": [[lo, hi), ...] of distances,
"mean_weight": [layer][head][distance bin], "mean_distance": [layer][head], "position_bins": [[lo, hi), ...]
of 1-based positions, "entropy": [layer][head][position bin] (nats), "uniform_entropy": [position bin]}; a
length the scheme cannot encode (pe=learned past its table) or the split cannot fill is
{"length", "windows": 0, "reason"}. The plots also go to the run's W&B run.
"""

from __future__ import annotations

import _repo

import json
import re
import sys
from pathlib import Path

import torch

from core.cli import exit_on_user_error
from core.errors import PosGPTError
from core.tracking import init_wandb
from data import eval_tokens
from evaluation.attention_stats import ATTENTION_FILE, attention_statistics, plot_distance, plot_entropy
from evaluation.run import EVAL_DIR
from experiment.build import load_trained_run, parse_run_dir
from model.pe.rope_scaling import scaling_label

USAGE = "usage: python scripts/inspect_attention.py run_dir=<training run directory> [inspect.* and other overrides]"


def output_suffix(scaling: str) -> str:
    """'' for no scaling, else the scaling label made safe for file names (yarn:8 -> _yarn-8)."""
    return "" if scaling in ("", "none") else "_" + re.sub(r"[^A-Za-z0-9.=]+", "-", scaling).strip("-")


@exit_on_user_error
def main(argv: list[str]) -> None:
    run = load_trained_run(*parse_run_dir(argv, USAGE))
    cfg, checkpoint, model, device, dtype, run_dir = run.cfg, run.checkpoint, run.model, run.device, run.dtype, run.dir
    multipliers = list(cfg.inspect.length_multipliers)
    if not multipliers or min(multipliers) <= 0 or cfg.inspect.windows <= 0:
        raise PosGPTError(
            "inspect.length_multipliers must be a non-empty list of positive numbers, and inspect.windows positive"
        )
    tokens = eval_tokens(cfg.data, checkpoint["config"]["data"], checkpoint.get("corpus"))
    scaling = scaling_label(getattr(model.pe.cfg, "scaling", None))
    entries = []
    for length in sorted({m * cfg.train.seq_len for m in multipliers}):
        entries.append(attention_statistics(model, tokens, length, cfg.inspect.windows, device, dtype))
        done = entries[-1]
        print(
            f"inspect: length {length}: "
            + (f"{done['windows']} windows" if done["reason"] is None else f"skipped ({done['reason']})"),
            flush=True,
        )
    if all(entry["reason"] is not None for entry in entries):
        raise PosGPTError(f"no length could be inspected: {entries[0]['reason']}")
    document = {
        "pe": cfg.pe.name,
        "train_seq_len": cfg.train.seq_len,
        "step": checkpoint["step"],
        "scaling": scaling or None,
        "data": cfg.data.name,
        "n_layer": cfg.model.n_layer,
        "n_head": cfg.model.n_head,
        "lengths": entries,
    }
    eval_dir = Path(run_dir) / EVAL_DIR
    eval_dir.mkdir(parents=True, exist_ok=True)
    suffix = output_suffix(scaling)
    paths = {
        "json": eval_dir / ATTENTION_FILE.replace(".json", f"{suffix}.json"),
        "distance": eval_dir / f"attention_distance{suffix}.png",
        "entropy": eval_dir / f"attention_entropy{suffix}.png",
    }
    paths["json"].write_text(json.dumps(document, indent=1) + "\n")
    plot_distance(document, paths["distance"])
    plot_entropy(document, paths["entropy"])
    print(f"inspect: wrote {', '.join(str(p) for p in paths.values())}", flush=True)
    wandb_run = init_wandb(cfg, run_dir, checkpoint.get("wandb_run_id"), job_type="inspect")
    if wandb_run is not None:
        import wandb

        wandb_run.log({f"attention/{name}{suffix}": wandb.Image(str(paths[name])) for name in ("distance", "entropy")})
        wandb_run.finish()


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main(sys.argv[1:])
