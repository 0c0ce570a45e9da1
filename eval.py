"""Evaluate a trained run at many context lengths (the length-extrapolation curve).

    python eval.py run_dir=outputs/2026-11-22/10-00-00-rope
    python eval.py run_dir=... eval.lengths=[64,256,1024] eval.protocols=[sliding] eval.stride=16
    python eval.py run_dir=... pe.scaling.type=yarn pe.scaling.factor=8     # RoPE context extension
    python eval.py run_dir=... eval.variations=[none,yarn:8,ntk:8,linear:8] # several in one go (the scheme's)
    python eval.py run_dir=... eval.variations=[none,self_extend:4:32,rerope:32]  # RoPE's Self-Extend, ReRoPE
    python eval.py run_dir=... data=text data.files=[/path/to/book.txt]     # another corpus
    python eval.py run_dir=<a task=passkey run> eval.task_half_width=0.03   # evaluation/task_accuracy.py
    python eval.py run_dir=... eval.evaluators=[my_metric]                  # a plug-in (evaluation/evaluator.py)
    python eval.py --check run_dir=... eval.lengths=[64,512]                # plan only: score and write nothing

The evaluation is planned first (plan_evaluation: every refusal, before the first file is written), then run: the
evaluators the settings ask for (evaluation/evaluators/), each one's rows stored and rendered (evaluation/run.py).

The model is built from the config stored in the checkpoint, never from today's configs/ YAML. Overrides
may change only what does not change what the trained weights compute (experiment/settings.py: data.*,
eval.*, logging.*, device, dtype, threads, the attention backend, and the scheme's declared
evaluation-time settings such as RoPE's pe.scaling and pe.remap); any other key is refused, named. Results land in
<run_dir>/eval/ (added to what earlier evaluations of the same checkpoint wrote there: see
evaluation/store.py) and in the training run's W&B run. While it runs, eval.py holds the run directory's lock
(core/rundir.py): it is refused while a training or another evaluation writes the run, and vice versa.

The training corpus is scored on its validation split; another corpus is scored whole (up to
eval.max_tokens), in rows labelled with data.name ("text" for data=text unless set: name each corpus).
data.eval_split=val|train|all chooses the split instead; each row records its corpus (by name and by the
digest of its tokens), split, targets, and the attention backend and dtype that computed it. Rows of earlier
evaluations are replaced only by rows of the same measurement (the console says which), never by rows of
another corpus, split or target range, whatever data.name says.
"""

from __future__ import annotations

from core.interrupts import unwind_on_sigterm  # first: Ctrl-C while the libraries below import is one line

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from core.checkpoint_io import checkpoint_dir
from core.cli import exit_on_user_error
from core.files import check_matplotlib_folders, check_outputs, check_writable
from core.rundir import EVAL_DIR, lock_run, refuse_if_live
from core.tracking import TrackerSettings, check_wandb, init_wandb
from data import TokenArray, eval_tokens
from data.tasks import NO_TASK
from evaluation.context import EvalContext
from evaluation.evaluator import Evaluator
from evaluation.perplexity_format import PER_POSITION_PLOT, PPL_PLOT
from evaluation.run import by_file, check_evaluators, evaluate_run
from experiment.build import load_trained_run, open_trained_model, parse_run_dir
from experiment.eval_checks import check_eval_settings
from experiment.plan import evaluation_plan, plan_evaluators, tracker_settings

USAGE = "usage: python eval.py [--check] run_dir=<training run directory> [hydra overrides, e.g. eval.lengths=[64,512]]"


@exit_on_user_error
def main(argv: list[str]) -> None:
    check_only = argv[:1] == ["--check"]
    run_dir, overrides = parse_run_dir(argv[1:] if check_only else argv, USAGE)
    if check_only:  # plan as the evaluation would, under no lock and writing nothing
        refuse_if_live(run_dir)
        plan_evaluation(run_dir, overrides)
        print(f"eval: {run_dir}: planned; nothing was scored or written", flush=True)
        return
    with lock_run(run_dir):
        evaluate(plan_evaluation(run_dir, overrides))


@dataclass(frozen=True)
class EvalPlan:
    """An evaluation, planned: what the header names (the run directory, its scheme, the checkpoint's step and the
    training length), the W&B run it continues (the settings and the checkpoint's run id), the evaluators (checked),
    their context (the model, where it runs, the lengths: evaluation/context.py), and the scored tokens."""

    run_dir: Path
    pe_name: str
    step: int
    train_seq_len: int
    tracker: TrackerSettings
    wandb_run_id: str | None
    evaluators: tuple[Evaluator, ...]
    context: EvalContext
    tokens: TokenArray | None


def plan_evaluation(run_dir: Path, overrides: list[str]) -> EvalPlan:
    """Every check of an evaluation, before anything is written: the settings, the evaluators and their refusals,
    the results files they add to, the outputs (not over an input, writable), W&B's mode, login and folder,
    matplotlib's folders, and the scored data."""
    run = load_trained_run(run_dir, overrides, "eval.py")
    cfg, checkpoint = run.cfg, run.checkpoint
    evaluators = plan_evaluators(cfg)
    check_eval_settings(cfg, evaluators)
    context = evaluation_plan(cfg, evaluators).context(
        run.model, run.dir, run.device, run.dtype, checkpoint["config"], checkpoint["step"], None, open_trained_model
    )
    files = [
        name for group in by_file(evaluators).values() for name in (group[0].rows.json_file, group[0].rows.csv_file)
    ]
    outputs = {name: run.dir / EVAL_DIR / name for name in (*files, PPL_PLOT, PER_POSITION_PLOT)}
    # The corpus scored and the checkpoint are read; the results must not land on them.
    check_outputs(
        outputs, inputs=[checkpoint_dir(run.dir), *(cfg.data.files if cfg.data.source == "text" else [])], run=run.dir
    )
    check_writable(outputs)
    tracker = tracker_settings(cfg)
    check_wandb(tracker, run.dir)
    check_matplotlib_folders()
    check_evaluators(context, evaluators)
    # data.eval_split: the val split of the training corpus, all of another one; a task run generates its own
    tokens = (
        eval_tokens(
            OmegaConf.to_object(cfg.data), checkpoint["config"]["data"], checkpoint.get("corpus"), cfg.logging.progress
        )
        if cfg.task.name == NO_TASK
        else None
    )
    return EvalPlan(
        run_dir=run.dir,
        pe_name=cfg.pe.name,
        step=checkpoint["step"],
        train_seq_len=cfg.train.seq_len,
        tracker=tracker,
        wandb_run_id=checkpoint.get("wandb_run_id"),
        evaluators=tuple(evaluators),
        context=context,
        tokens=tokens,
    )


def evaluate(plan: EvalPlan) -> None:
    """Start W&B (continuing the training run's W&B run), then run the planned evaluators."""
    wandb_run = init_wandb(plan.tracker, plan.run_dir, plan.wandb_run_id, "eval")
    context = dataclasses.replace(plan.context, wandb_run=wandb_run)
    print(
        f"eval: {plan.run_dir} (pe={plan.pe_name}, trained {plan.step} steps at length {plan.train_seq_len})",
        flush=True,
    )
    evaluate_run(context, plan.tokens, list(plan.evaluators))
    if context.wandb_run is not None:
        context.wandb_run.finish()


if __name__ == "__main__":
    unwind_on_sigterm()  # SIGTERM unwinds: an atomic write in progress leaves no temporary file
    torch.set_grad_enabled(False)
    main(sys.argv[1:])
