"""The evaluation of a trained run: its evaluators checked, then run, their rows stored and rendered.

``check_evaluators(ctx, evaluators)`` runs every selected evaluator's refusals (evaluation/evaluator.py) and reads
the results files they will add to (a damaged one is refused, naming it), before anything is scored or written;
``evaluate_run(ctx, tokens, evaluators)`` then runs them, a results file at a time: the evaluators that share a
file (perplexity, streaming and key tokens: extrapolation.json; task accuracy and the copy probe: tasks.json) run
one after another, and their rows, each stamped with what scored it (EvalContext.provenance), are merged into the
file once (evaluation/store.py) and rendered (evaluation/render.py): the CSV and plots beside it, the table on the
console, the W&B log. A file is written before the next file's evaluators start, so a run stopped between them
keeps what was done.

Outputs, in ``<run_dir>/eval/``: ``<file>.json`` (every row, accumulated over evaluations of this checkpoint),
``<file>.csv`` (the same rows, flat), and each file's plots (perplexity: ppl_vs_length.png, per_position.png;
tasks: accuracy_vs_length.png and a heatmap per grid).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.errors import PosGPTError
from core.rundir import EVAL_DIR
from data import TokenArray
from evaluation.context import EvalContext
from evaluation.evaluator import Evaluator
from evaluation.perplexity_format import load_results
from evaluation.render import report
from evaluation.store import RowFormat, load_document, merge_documents, new_document, write_document


def by_file(evaluators: list[Evaluator]) -> dict[str, list[Evaluator]]:
    """The evaluators grouped by the results file they write, in the order of their first."""
    groups: dict[str, list[Evaluator]] = {}
    for evaluator in evaluators:
        groups.setdefault(evaluator.rows.file, []).append(evaluator)
    return groups


def check_evaluators(ctx: EvalContext, evaluators: list[Evaluator]) -> None:
    """Every variation applied to the model once (a variation the run cannot take, such as a window past its
    training length, is refused by its scheme), every evaluator's refusals, and every results file they add to
    read (a damaged one refused): before any scoring or writing."""
    if ctx.model is not None:
        for _ in ctx.variations():
            pass
    for evaluator in evaluators:
        evaluator.check(ctx)
    for group in by_file(evaluators).values():
        load_document(ctx.eval_dir, group[0].rows)


def evaluate_run(ctx: EvalContext, tokens: TokenArray | None, evaluators: list[Evaluator]) -> dict[str, Any]:
    """Run the (checked) evaluators, a results file at a time, and write and render each file. Returns the
    document written last."""
    document: dict[str, Any] = {}
    for group in by_file(evaluators).values():
        rows = []
        for evaluator in group:
            settings = evaluator.recorded_settings()
            rows += [ctx.provenance(row, evaluator.name, settings) for row in evaluator.run(ctx, tokens)]
        document = store_rows(ctx, group, rows)
    return document


def store_rows(ctx: EvalContext, group: list[Evaluator], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Merge the rows of evaluators that share a file into it, then render it."""
    fmt: RowFormat = group[0].rows
    header: dict[str, Any] = {"pe": ctx.scheme, "train_seq_len": ctx.train_len, "step": ctx.step}
    options: dict[str, Any] = {}
    for evaluator in group:
        header.update(evaluator.header(ctx))
        options.update(evaluator.plot_options())
    header["config"] = ctx.trained_config
    document, replaced = merge_documents(load_document(ctx.eval_dir, fmt), new_document(header, rows), fmt)
    if replaced:
        print(f"eval: {replaced}", flush=True)
    for evaluator in group:
        document = evaluator.finish(document)
    write_document(document, ctx.eval_dir, fmt)
    report(document, ctx.eval_dir, fmt, options, ctx.wandb_run)
    return document


def load_run_results(run_dir: Path) -> dict[str, Any]:
    """A training run's ``eval/extrapolation.json``; a PosGPTError that says how to make it when there is none."""
    document = load_results(Path(run_dir) / EVAL_DIR)
    if document is None:
        raise PosGPTError(f"{run_dir} has no {EVAL_DIR}/extrapolation.json; run python eval.py run_dir={run_dir}")
    return document
