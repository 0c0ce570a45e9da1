"""Run the extrapolation evaluation of a model and write its reports (called by train.py's loop and eval.py).

Outputs, in ``<run_dir>/eval/``:
    extrapolation.json   every result row, accumulated over evaluations of this checkpoint (see report.py)
    extrapolation.csv    the same rows, flat
    ppl_vs_length.png    perplexity vs evaluation length, one line per setting (protocol, stride, variation)
    per_position.png     loss vs position within the window (nonoverlapping, the longest length by default)
and the same table and plots in the run's W&B run.

Each of the scheme's evaluation-time variations asked for in ``eval.variations`` is evaluated (else the run as
configured), its label and settings recorded in the rows (``variation``, ``variation_settings``), beside what the
rows scored (the corpus by content, the split, the targets) and what computed them (the attention backend that
ran, the dtype): see report.py. The console says what earlier rows were replaced, and when no length could be
scored at all.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from core.errors import PosGPTError
from core.rundir import EVAL_DIR
from data import TokenArray, describe_corpus
from data.tasks import NO_TASK
from evaluation.extrapolation import evaluate_extrapolation
from evaluation.plots import Series, bin_centre, bins_note, plot_per_position, plot_ppl_vs_length
from evaluation.report import (
    CSV_COLUMNS,
    CSV_FILE,
    csv_rows,
    format_table,
    labelled_rows,
    load_results,
    merge_documents,
    read_results,
    results_document,
    row_ppl,
    write_csv,
    write_results,
)
from experiment.config import eval_lengths
from model.attention import resolve_layer_backends
from model.temperature import temperature_settings

PPL_PLOT = "ppl_vs_length.png"
PER_POSITION_PLOT = "per_position.png"


def as_plain(value: Any) -> Any:
    """A setting's value as JSON can hold it (a dataclass, such as a scheme's nested config, becomes a dict)."""
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def variation_fields(label: str, settings: dict[str, Any], cfg: DictConfig) -> dict[str, Any]:
    """What a result row (perplexity, task, copy probe) records of what its model was evaluated with besides its
    weights: the scheme's evaluation-time variation (its label and settings) and the attention temperature."""
    return {
        "variation": label,
        "variation_settings": {name: as_plain(value) for name, value in settings.items()},
        "attn_temperature": temperature_settings(cfg.model.attn_temperature),
    }


def run_extrapolation_eval(
    cfg: DictConfig,
    model: torch.nn.Module,
    val_tokens: TokenArray,
    run_dir: str | Path,
    device: torch.device,
    dtype: torch.dtype,
    trained_config: dict[str, Any],
    wandb_run=None,
    step: int | None = None,
) -> dict[str, Any]:
    """Evaluate, merge into ``<run_dir>/eval/extrapolation.json``, write the CSV and plots, log to W&B.

    ``trained_config`` is the checkpoint's config (what the weights were trained with; ``cfg`` may differ in
    what an evaluation may change, e.g. the data), recorded in the document. ``step`` is the checkpoint's
    training step (None: training just ended, at ``train.max_steps``).
    """
    if cfg.task.name != NO_TASK:  # a task run: accuracy by length instead of perplexity
        from evaluation.tasks import run_task_eval

        return run_task_eval(cfg, model, run_dir, device, dtype, trained_config, wandb_run, step)
    if cfg.eval.tasks:  # zero-shot probes (eval.tasks=[copy_probe]): their settings are checked before any scoring
        from evaluation.copy_probe import probe_candidates, run_copy_probe

        candidates = probe_candidates(cfg, model.vocab_size)
    rows = []
    # The scheme's evaluation-time variations (eval.variations, else the run as configured); [("", {})] for most.
    for label, settings in model.pe.eval_variations(list(cfg.eval.variations or [])):
        with model.pe.evaluated_with(settings):
            backend = resolve_layer_backends(cfg.model.attn_backend, model.pe, device)  # a variation may change it
            new_rows = evaluate_extrapolation(
                model,
                val_tokens,
                eval_lengths(cfg),
                list(cfg.eval.protocols),
                cfg.eval.stride,
                cfg.eval.max_tokens,
                cfg.eval.batch_tokens,
                device,
                dtype,
                progress=cfg.logging.progress,
                description=label,
                sinks=cfg.eval.streaming_sinks,
            )
        setting = {
            **variation_fields(label, settings, cfg),
            "data": cfg.data.name,
            "corpus": describe_corpus(cfg.data),
            "split": val_tokens.name,
            "split_digest": val_tokens.digest,
            "attn_backend": backend,
            "dtype": str(dtype).removeprefix("torch."),
        }
        rows += [
            {"length": r["length"], "protocol": r["protocol"], "stride": r["stride"], **setting, **r} for r in new_rows
        ]
    if all(row_ppl(row) is None for row in rows):
        shortest = min(rows, key=lambda row: row["length"])
        print(
            f"eval: nothing could be scored on {cfg.data.name} ({val_tokens.name} split, {len(val_tokens):,} "
            f"tokens); at the shortest length, {shortest['length']}: {shortest['reason']}",
            flush=True,
        )
    step = cfg.train.max_steps if step is None else step
    document = results_document(
        cfg.pe.name, cfg.train.seq_len, rows, step=step, data=cfg.data.name, config=trained_config
    )
    eval_dir = Path(run_dir) / EVAL_DIR
    document, replaced = merge_documents(read_results(eval_dir), document)
    if replaced:
        print(f"eval: {replaced}", flush=True)
    path = write_results(document, eval_dir)
    write_csv(document, eval_dir / CSV_FILE)
    plots = write_plots(document, eval_dir, cfg.eval.per_position_plot_lengths)
    print(format_table(document), flush=True)
    print(f"eval: wrote {path}, {CSV_FILE} and {', '.join(p.name for p in plots.values())}", flush=True)
    if wandb_run is not None:
        _log_to_wandb(wandb_run, document, plots)
    if cfg.eval.tasks:
        run_copy_probe(cfg, model, val_tokens, candidates, run_dir, device, dtype, trained_config, wandb_run, step)
    return document


def load_run_results(run_dir: Path) -> dict[str, Any]:
    """A training run's ``eval/extrapolation.json``; a PosGPTError that says how to make it when there is none."""
    document = load_results(Path(run_dir) / EVAL_DIR)
    if document is None:
        raise PosGPTError(f"{run_dir} has no {EVAL_DIR}/extrapolation.json; run python eval.py run_dir={run_dir}")
    return document


def per_position_rows(document: dict[str, Any], lengths: list[int] | None = None) -> list[dict[str, Any]]:
    """The rows per_position.png draws: nonoverlapping (where evaluated), at ``lengths`` or the longest scored.
    Rows without position bins (written by an older posgpt, before bins were stored) are not drawn."""
    scored = [row for row in document["results"] if row_ppl(row) is not None and "per_position_bins" in row]
    protocol = "nonoverlapping" if any(r["protocol"] == "nonoverlapping" for r in scored) else "sliding"
    scored = [row for row in scored if row["protocol"] == protocol]
    lengths = lengths or ([max(row["length"] for row in scored)] if scored else [])
    return [row for row in scored if row["length"] in lengths]


def write_plots(document: dict[str, Any], eval_dir: Path, per_position_lengths: list[int] | None) -> dict[str, Path]:
    pe, train_len = document["pe"], document["train_seq_len"]
    labelled = labelled_rows(document["results"])
    curves: dict[str, Series] = {}
    for label, row in sorted(labelled, key=lambda item: item[1]["length"]):
        line = curves.setdefault(label, Series(label, pe, [], []))
        ppl = row_ppl(row)
        if ppl is not None and math.isfinite(ppl):  # not evaluable there, or inf (a diverged model): left out
            line.x.append(row["length"])
            line.y.append(ppl)
    plots = {
        "ppl_vs_length": plot_ppl_vs_length(
            list(curves.values()),
            {train_len},
            eval_dir / PPL_PLOT,
            f"pe={pe}, trained at length {train_len} (step {document['step']})",
        )
    }
    position_rows = per_position_rows(document, per_position_lengths)
    missing = sorted(set(per_position_lengths or []) - {row["length"] for row in position_rows})
    if missing:
        print(f"eval: {PER_POSITION_PLOT} has no line at lengths {missing}: nothing was scored there", flush=True)
    labels = {id(row): label for label, row in reversed(labelled)}  # a row in several lines: its first label
    several_lengths = len({row["length"] for row in position_rows}) > 1
    position_series = [
        Series(
            labels[id(row)] + (f" L={row['length']}" if several_lengths else ""),
            pe,
            [bin_centre(*b["positions"]) for b in row["per_position_bins"] if b["loss"] is not None],
            [b["loss"] for b in row["per_position_bins"] if b["loss"] is not None],
        )
        for row in position_rows
    ]
    plots["per_position"] = plot_per_position(
        position_series,
        {train_len},
        eval_dir / PER_POSITION_PLOT,
        f"pe={pe}: loss by position, trained at length {train_len}\n{bins_note(position_rows)}",
    )
    return plots


def _log_to_wandb(wandb_run, document: dict[str, Any], plots: dict[str, Path]) -> None:
    """The whole table (every accumulated row), both plots, and ppl per setting and length in the summary."""
    import wandb

    table = wandb.Table(columns=CSV_COLUMNS, data=[[r[c] for c in CSV_COLUMNS] for r in csv_rows(document)])
    wandb_run.log(
        {
            "extrapolation/table": table,
            **{f"extrapolation/{name}": wandb.Image(str(path)) for name, path in plots.items()},
        }
    )
    for label, row in labelled_rows(document["results"]):
        ppl = row_ppl(row)
        if ppl is not None and math.isfinite(ppl):
            wandb_run.summary[f"extrapolation/{label}/ppl@{row['length']}"] = ppl
