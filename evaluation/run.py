"""Evaluate a trained run and write its reports: ``evaluate_run(ctx, val_tokens)``, called by eval.py and at the
end of training with the run's context (evaluation/context.py). A task run is scored by evaluation/task_accuracy.py; a
language-model run by perplexity here, then by the probes of eval.tasks (evaluation/copy_probe.py).

Outputs, in ``<run_dir>/eval/``:
    extrapolation.json   every result row, accumulated over evaluations of this checkpoint (see results.py)
    extrapolation.csv    the same rows, flat
    ppl_vs_length.png    perplexity vs evaluation length, one line per setting (protocol, stride, variation)
    per_position.png     loss vs position within the window (nonoverlapping, the longest length by default)
and the same table and plots in the run's W&B run.

Each of the scheme's evaluation-time variations asked for in ``eval.variations`` is evaluated (else the run as
configured), its label and settings recorded in the rows (``variation``, ``variation_settings``), beside what the
rows scored (the corpus by content, the split, the targets) and what computed them (the attention backend that
ran, the dtype): see results.py. The console says what earlier rows were replaced, and when no length could be
scored at all. With eval.key_tokens=true, key-token perplexity rows (LongPPL, evaluation/key_tokens.py) join them:
the evaluator selects the key tokens once, and each variation is scored on them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from core.errors import PosGPTError
from core.rundir import EVAL_DIR
from data import TokenArray, describe_corpus
from data.tasks import NO_TASK
from evaluation.context import EvalContext
from evaluation.copy_probe import probe_candidates, run_copy_probe
from evaluation.extrapolation import evaluate_extrapolation
from evaluation.key_tokens import find_key_tokens
from evaluation.plots import Series, bin_centre, bins_note, plot_per_position, plot_ppl_vs_length
from evaluation.results import (
    CSV_COLUMNS,
    CSV_FILE,
    KEY_SETTINGS,
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
from evaluation.task_accuracy import run_task_eval
from model.attention import resolve_layer_backends

PPL_PLOT = "ppl_vs_length.png"
# The eval.* settings a perplexity row depends on besides its own fields (length, protocol, stride), recorded in it;
# a key-token row's are its selection's too (evaluation/key_tokens.py).
PERPLEXITY_SETTINGS = ("max_tokens", "batch_tokens", "streaming_sinks")
KEY_TOKEN_SETTINGS = (
    *PERPLEXITY_SETTINGS,
    *(name for name in KEY_SETTINGS if name != "key_evaluator_step"),  # the step: the evaluator's checkpoint's
)
PER_POSITION_PLOT = "per_position.png"


def evaluate_run(ctx: EvalContext, val_tokens: TokenArray | None) -> dict[str, Any]:
    """The run's evaluation: a task run's accuracy by length (evaluation/task_accuracy.py); a language-model run's
    perplexity on ``val_tokens`` by length and protocol, then the probes of eval.tasks. Returns the document written
    last."""
    if ctx.cfg.task.name != NO_TASK:
        return run_task_eval(ctx)
    # zero-shot probes (eval.tasks=[copy_probe]): their settings are checked before any scoring
    candidates = probe_candidates(ctx.cfg, ctx.model.vocab_size) if ctx.cfg.eval.tasks else None
    document = run_extrapolation_eval(ctx, val_tokens)
    if candidates is not None:
        document = run_copy_probe(ctx, val_tokens, candidates)
    return document


def run_extrapolation_eval(ctx: EvalContext, val_tokens: TokenArray) -> dict[str, Any]:
    """Score perplexity by length and protocol, merge into ``<run_dir>/eval/extrapolation.json``, write the CSV
    and plots, log to W&B."""
    rows = [ctx.provenance(row, *_evaluator(row)) for row in score_perplexity(ctx, val_tokens)]
    if all(row_ppl(row) is None for row in rows):
        shortest = min(rows, key=lambda row: row["length"])
        print(
            f"eval: nothing could be scored on {ctx.cfg.data.name} ({val_tokens.name} split, {len(val_tokens):,} "
            f"tokens); at the shortest length, {shortest['length']}: {shortest['reason']}",
            flush=True,
        )
    cfg = ctx.cfg
    document = results_document(
        cfg.pe.name, cfg.train.seq_len, rows, step=ctx.step, data=cfg.data.name, config=ctx.trained_config
    )
    document, replaced = merge_documents(read_results(ctx.eval_dir), document)
    if replaced:
        print(f"eval: {replaced}", flush=True)
    path = write_results(document, ctx.eval_dir)
    write_csv(document, ctx.eval_dir / CSV_FILE)
    plots = write_plots(document, ctx.eval_dir, cfg.eval.per_position_plot_lengths)
    print(format_table(document), flush=True)
    print(f"eval: wrote {path}, {CSV_FILE} and {', '.join(p.name for p in plots.values())}", flush=True)
    if ctx.wandb_run is not None:
        _log_to_wandb(ctx.wandb_run, document, plots)
    return document


def _evaluator(row: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """The evaluator that scored a perplexity document's row, and the eval.* settings it depends on."""
    return ("key_tokens", KEY_TOKEN_SETTINGS) if row.get("measure") else ("perplexity", PERPLEXITY_SETTINGS)


def score_perplexity(ctx: EvalContext, val_tokens: TokenArray) -> list[dict[str, Any]]:
    """Rows for every evaluation-time variation, length and protocol, each recording what it scored (the corpus
    by content, the split) and what computed it (the attention backend that ran, the dtype)."""
    cfg, e = ctx.cfg, ctx.cfg.eval
    provenance = {
        "data": cfg.data.name,
        "corpus": describe_corpus(cfg.data),
        "split": val_tokens.name,
        "split_digest": val_tokens.digest,
    }
    dtype = str(ctx.dtype).removeprefix("torch.")
    rows = []
    # eval.key_tokens: the evaluator selects the key tokens once, before any variation is applied to the model
    selection = find_key_tokens(ctx, val_tokens) if e.key_tokens else None
    for label, fields in ctx.variations():
        # a variation may change the backend
        backend = resolve_layer_backends(cfg.model.attn_backend, ctx.model.pe, ctx.device, sink=cfg.model.attn_sink)
        scored = evaluate_extrapolation(
            ctx.model,
            val_tokens,
            ctx.lengths,
            list(e.protocols),
            e.stride,
            e.max_tokens,
            e.batch_tokens,
            ctx.device,
            ctx.dtype,
            progress=ctx.progress,
            description=label,
            sinks=e.streaming_sinks,
        )
        scored += selection.rows(ctx, val_tokens) if selection is not None else []
        setting = {**fields, **provenance, "attn_backend": backend, "dtype": dtype}
        rows += [
            {"length": r["length"], "protocol": r["protocol"], "stride": r["stride"], **setting, **r} for r in scored
        ]
    return rows


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
        if row.get("measure"):  # key-token perplexity: another measure, in the table only
            continue
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
            f"pe={pe}: perplexity by length",
            f"trained at length {train_len} (step {document['step']}); dashed: the training length",
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
        f"pe={pe}: loss by position",
        f"trained at length {train_len} (step {document['step']}); {bins_note(position_rows)}",
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
