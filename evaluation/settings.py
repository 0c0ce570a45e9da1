"""The ``eval.*`` settings several evaluators read, and those the evaluation's plan reads, each declared once.

Each ``eval.*`` setting is declared once, with its default, its domain and readers (core.domain's ``domain``,
``choice``, ``read_with``) and its comment, in the frozen settings type of what reads it: an evaluator's ``Settings``
(evaluation/evaluators/, or the module that scores for it: evaluation/key_tokens.py's ``KeyTokenSettings``) for a
setting one evaluator reads, the switch that asks for it included (``eval.key_tokens``, ``eval.tasks``); one of the
small types here, which each evaluator that reads it inherits, for a setting several read (:class:`TokenBudget`:
``eval.max_tokens``; :class:`Batching`: ``eval.batch_tokens``; ...); and :class:`EvaluationSettings` for what the
evaluation's plan and the selection of evaluators read rather than any one evaluator (its lengths, its variations,
the evaluators it adds).

The schema's ``eval`` section (experiment/config.py, ``EvalConfig``) is made from those types by core.settings'
``schema_section``; :func:`settings_of` fills a type from the composed section by field name (an evaluator's settings,
:meth:`evaluation.evaluator.Evaluator.of`), and the planner reads the plan's (experiment/eval_checks.py,
``evaluation_plan``).

A type validates what it declares: one whose own body defines ``check(self, plan)`` raises there, naming the setting,
when a value of a field its own body declares asks for what the evaluation cannot produce, given the other settings
and the run (the evaluated lengths, the training length, the task, ``train.random_positions``: evaluation/context.py's
``EvaluationPlan``). A check refuses only its own type's fields (those of its bases are their checks'), so that a
setting several types share is checked once, by the type that declares it. :func:`check_settings` runs every such
check of a list of types and of their bases, each declaring type once: the planner runs those of the eval section's
types (experiment/eval_checks.py), before any work, whichever evaluators the settings select.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from core.domain import BENCHMARKS, choice, domain
from core.errors import PosGPTError
from core.settings import run_declared_checks
from data.tasks import build_task
from evaluation.extrapolation import PROTOCOLS
from evaluation.results import PROBES

if TYPE_CHECKING:
    from evaluation.context import EvaluationPlan

TEXT, TASK = ("text",), ("task",)  # the kinds of run that read a setting (core.domain's runs)


@dataclass(frozen=True, kw_only=True)
class EvaluationSettings:
    """What the evaluation's plan (experiment/eval_checks.py, evaluation_plan; evaluation/context.py,
    EvaluationPlan) and the selection of its evaluators (evaluation/evaluator.py, select_evaluators) read."""

    lengths: tuple[int, ...] | None = domain(None, ge=1)  # absolute lengths; None: length_multipliers x train.seq_len
    # x train.seq_len, rounded to whole tokens; below 1 checks that a run holds its 1x result at shorter lengths
    length_multipliers: tuple[float, ...] = domain(default_factory=lambda: [1, 2, 4, 8], gt=0, nonempty=True)
    # Several evaluation-time variations of the scheme in one go, in the scheme's own notation (its
    # parse_variation, model/pe/); None: the run as configured.
    variations: tuple[str, ...] | None = None
    # Evaluators to run besides those the settings above ask for (evaluation/evaluator.py; evaluation/evaluators/)
    evaluators: tuple[str, ...] | None = None

    def check(self, plan: EvaluationPlan) -> None:
        """Each length at least one token (a multiple of a short training length can round to none), and a task
        run's lengths must fit the task's format: a shorter one would fail after training, with nothing scored."""
        if plan.lengths and min(plan.lengths) < 1:
            raise PosGPTError(
                f"eval.length_multipliers={list(self.length_multipliers)} gives a length below one token at "
                f"train.seq_len={plan.train_len}: each multiple of it must round to at least 1"
            )
        task = None if plan.task is None else build_task(plan.task)
        if task is not None and min(plan.lengths) + 1 < task.min_length():
            short = [length for length in plan.lengths if length + 1 < task.min_length()]
            raise PosGPTError(
                f"evaluation lengths {short} (eval.lengths or eval.length_multipliers x train.seq_len) are shorter "
                f"than task={task.name} can fill with its settings ({task.min_length() - 1} tokens): drop them"
            )


@dataclass(frozen=True, kw_only=True)
class Protocols:
    """The perplexity protocols asked for: read by perplexity and key-token perplexity (the long-context ones) and
    by the streaming evaluator (asked for by its own)."""

    # perplexity's protocols (evaluation/extrapolation.py): or streaming
    protocols: tuple[str, ...] = choice(["nonoverlapping", "sliding"], PROTOCOLS, runs=TEXT, nonempty=True)


@dataclass(frozen=True, kw_only=True)
class SlidingWindows(Protocols):
    """The long-context protocols' windows: perplexity's and key-token perplexity's."""

    stride: int | None = domain(None, ge=1, runs=TEXT)  # sliding-window stride; None: half the window

    def check(self, plan: EvaluationPlan) -> None:
        """A stride is the sliding protocol's: refused without it."""
        if self.stride is not None and "sliding" not in self.protocols:
            raise PosGPTError(
                f"eval.stride={self.stride} is the sliding protocol's stride, but eval.protocols="
                f"{list(self.protocols)} has no sliding: add sliding or drop eval.stride"
            )


@dataclass(frozen=True, kw_only=True)
class TokenBudget:
    """How many tokens an evaluator of a language-model run scores at each length."""

    # scored tokens per (length, protocol): the same token range for all
    max_tokens: int = domain(32768, ge=1, runs=TEXT)

    def check(self, plan: EvaluationPlan) -> None:
        """Every length of a language-model run is scored on the same max_tokens targets, so each window must fit in
        them (a task run generates its examples: no budget)."""
        too_long = [length for length in plan.lengths if length > self.max_tokens] if plan.task is None else []
        if too_long:
            raise PosGPTError(
                f"evaluation lengths {too_long} exceed eval.max_tokens={self.max_tokens}, the targets every length is "
                "scored on: no window of them fits; raise eval.max_tokens or drop those lengths"
            )


@dataclass(frozen=True, kw_only=True)
class Batching:
    """How many tokens one forward pass of the evaluation holds."""

    # tokens per forward pass (windows are batched up to this)
    batch_tokens: int = domain(16384, ge=1, commands=("train", "eval", *BENCHMARKS))


@dataclass(frozen=True, kw_only=True)
class AccuracyInterval:
    """How closely an accuracy is measured, and the accuracy a length must reach: task accuracy's and the copy
    probe's."""

    # Task runs (task=...; evaluation/task_accuracy.py): each cell gets enough examples for a 95% interval of at most
    # ± task_half_width; the effective length is the longest length up to which accuracy >= task_threshold.
    # (both read by the copy probe too, the only readers in a language-model run: check)
    task_half_width: float = domain(0.05, gt=0, le=0.5)
    task_threshold: float = domain(0.9, gt=0, le=1)

    def check(self, plan: EvaluationPlan) -> None:
        """A language-model run reads these only for its zero-shot probes (asked for by eval.tasks or by name in
        eval.evaluators): without one they change nothing."""
        if plan.task is not None or set(plan.evaluators) & set(PROBES):
            return
        for name in ("task_half_width", "task_threshold"):
            value = getattr(self, name)
            if value != getattr(AccuracyInterval, name):
                raise PosGPTError(
                    f"eval.{name}={value} is read only by a task run or the probes (eval.tasks, or by name in "
                    f"eval.evaluators); this language-model run (data={plan.data.name}) has none: drop it"
                )


def settings_of(kind: type, section: Mapping[str, Any]) -> Any:
    """The frozen settings type ``kind`` with each of its fields read from ``section`` (the evaluation's ``eval.*``
    values) by name, a list as a tuple."""
    return kind(**{item.name: _plain(section[item.name]) for item in dataclasses.fields(kind)})


def check_settings(stages: Sequence[type], section: Mapping[str, Any], plan: EvaluationPlan) -> None:
    """core.settings' ``run_declared_checks`` of the settings types ``stages``, each read from ``section`` (the
    eval.* values), with the evaluation's ``plan``: PosGPTError from the first that refuses."""
    run_declared_checks({stage: settings_of(stage, section) for stage in stages}, plan)


def _plain(value: Any) -> Any:
    """A setting's value as a plain Python value (an OmegaConf list as a tuple: the settings are frozen)."""
    return tuple(value) if OmegaConf.is_list(value) or isinstance(value, list) else value
