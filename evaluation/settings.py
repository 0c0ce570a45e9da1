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
``schema_section``; :meth:`evaluation.evaluator.Evaluator.of` fills an evaluator's settings from the composed section
by field name, and the planner reads the plan's (experiment/plan.py, ``evaluation_plan``).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.domain import BENCHMARKS, choice, domain
from evaluation.extrapolation import PROTOCOLS

TEXT, TASK = ("text",), ("task",)  # the kinds of run that read a setting (core.domain's runs)


@dataclass(frozen=True, kw_only=True)
class EvaluationSettings:
    """What the evaluation's plan (experiment/plan.py, evaluation_plan; evaluation/context.py, EvaluationPlan) and
    the selection of its evaluators (evaluation/evaluator.py, select_evaluators) read."""

    lengths: tuple[int, ...] | None = domain(None, ge=1)  # absolute lengths; None: length_multipliers x train.seq_len
    # x train.seq_len, rounded to whole tokens; below 1 checks that a run holds its 1x result at shorter lengths
    length_multipliers: tuple[float, ...] = domain(default_factory=lambda: [1, 2, 4, 8], gt=0)
    # Several evaluation-time variations of the scheme in one go, in the scheme's own notation (its
    # parse_variation, model/pe/); None: the run as configured.
    variations: tuple[str, ...] | None = None
    # Evaluators to run besides those the settings above ask for (evaluation/evaluator.py; evaluation/evaluators/)
    evaluators: tuple[str, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class Protocols:
    """The perplexity protocols asked for: read by perplexity and key-token perplexity (the long-context ones) and
    by the streaming evaluator (asked for by its own)."""

    # perplexity's protocols (evaluation/extrapolation.py): or streaming
    protocols: tuple[str, ...] = choice(["nonoverlapping", "sliding"], PROTOCOLS, runs=TEXT)


@dataclass(frozen=True, kw_only=True)
class SlidingWindows(Protocols):
    """The long-context protocols' windows: perplexity's and key-token perplexity's."""

    stride: int | None = domain(None, ge=1, runs=TEXT)  # sliding-window stride; None: half the window


@dataclass(frozen=True, kw_only=True)
class TokenBudget:
    """How many tokens an evaluator of a language-model run scores at each length."""

    # scored tokens per (length, protocol): the same token range for all
    max_tokens: int = domain(32768, ge=1, runs=TEXT)


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
    # (both read by the copy probe too: experiment/config.py's PROBE_READS)
    task_half_width: float = domain(0.05, gt=0, le=0.5)
    task_threshold: float = domain(0.9, gt=0, le=1)
