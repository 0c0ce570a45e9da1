"""Run the extrapolation evaluation for a model and write/log its reports (used by train.py and eval.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from core.config import eval_lengths
from evaluation.extrapolation import evaluate_extrapolation
from evaluation.report import format_table, results_document, write_results

EVAL_DIR = "eval"


def scaling_of(cfg: DictConfig) -> dict[str, Any] | None:
    """The RoPE scaling in force (recorded in every row), or None for schemes without one."""
    scaling = cfg.pe.get("scaling")
    return OmegaConf.to_container(scaling, resolve=True) if scaling is not None else None


def run_extrapolation_eval(cfg: DictConfig, model: torch.nn.Module, val_tokens, run_dir: str | Path,
                           device: torch.device, dtype: torch.dtype, wandb_run=None) -> dict[str, Any]:
    rows = evaluate_extrapolation(
        model, val_tokens, eval_lengths(cfg), list(cfg.eval.protocols), cfg.eval.stride, cfg.eval.max_tokens,
        cfg.eval.batch_tokens, device, dtype, progress=cfg.logging.progress,
    )
    scaling = scaling_of(cfg)
    for row in rows:
        row["scaling"] = scaling
    document = results_document(cfg.pe.name, cfg.train.seq_len, rows, data=cfg.data.name)
    path = write_results(document, Path(run_dir) / EVAL_DIR)
    print(format_table(document), flush=True)
    print(f"eval: wrote {path}", flush=True)
    if wandb_run is not None:
        _log_to_wandb(wandb_run, document)
    return document


def _log_to_wandb(wandb_run, document: dict[str, Any]) -> None:
    import wandb

    columns = ["length", "protocol", "stride", "tokens", "loss", "ppl"]
    table = wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in document["results"]])
    wandb_run.log({"extrapolation/table": table})
    for row in document["results"]:
        if row["ppl"] is not None:
            wandb_run.summary[f"extrapolation/{row['protocol']}/ppl@{row['length']}"] = row["ppl"]
