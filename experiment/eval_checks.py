"""The evaluation's plan of a run's config, and the evaluation settings that name something it would not produce:
refused at plan time, before any work.

experiment.config.validate checks each eval.* value on its own (positive, known names); the settings types that
declare them relate them to each other and to the run (its lengths, its training length, its task): each type's
``check`` (evaluation/settings.py). The planner runs every check of the eval section's types (experiment/config.py,
``EVAL_STAGES``), whichever evaluators the settings select: train.py at its start (so a run does not train for hours
and then find its evaluation settings wrong), eval.py before it loads any data.
"""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig, OmegaConf

from data.tasks import NO_TASK
from evaluation.context import EvaluationPlan
from evaluation.evaluator import Evaluator, select_evaluators
from evaluation.settings import check_settings
from experiment.config import EVAL_STAGES, eval_lengths


def check_eval_settings(cfg: DictConfig, evaluators: Sequence[Evaluator] | None = None) -> None:
    """PosGPTError, naming the setting, when an eval.* setting asks for what the evaluation cannot produce: the
    checks of every settings type of the eval section, on the section's values and the run's plan."""
    check_settings(EVAL_STAGES, OmegaConf.to_container(cfg.eval, resolve=True), evaluation_plan(cfg, evaluators))


def evaluation_plan(cfg: DictConfig, evaluators: Sequence[Evaluator] | None = None) -> EvaluationPlan:
    """What an evaluation of the run of ``cfg`` reads of it (evaluation/context.py), typed, the lengths resolved.
    ``evaluators``: the evaluation's, as the command selected them (None: selected here)."""
    text = cfg.task.name == NO_TASK
    if evaluators is None:
        evaluators = select_evaluators(OmegaConf.to_container(cfg.eval, resolve=True), "text" if text else "task")
    return EvaluationPlan(
        step=cfg.train.max_steps,
        lengths=tuple(eval_lengths(cfg)),
        scheme=cfg.pe.name,
        train_len=cfg.train.seq_len,
        train_seed=cfg.train.seed,
        data=OmegaConf.to_object(cfg.data) if text else None,
        task=None if text else OmegaConf.to_object(cfg.task),
        variation_names=tuple(cfg.eval.variations or ()),
        attn_temperature=cfg.model.attn_temperature,
        attn_backend=cfg.model.attn_backend,
        attn_sink=cfg.model.attn_sink,
        train_random_positions=cfg.train.random_positions,
        evaluators=tuple(evaluator.name for evaluator in evaluators),
        progress=bool(cfg.logging.progress),
    )
