"""Key-token perplexity (LongPPL; Fang et al. 2025, "What is Wrong with Perplexity for Long-context Language
Modeling?"), ``eval.key_tokens=true``: perplexity over only the targets whose prediction the far context improves
markedly, judged by one fixed evaluator.

At each evaluated length L' longer than the short context S, over the same targets as every other row
(extrapolation.scored_range), the evaluator θ0 predicts each target x_t twice: from the long context l(t) its
protocol gives it (the nonoverlapping or sliding windows of L'), and from a short context s(t), the last tokens of
l(t). The short contexts come from one pass of the sliding protocol with windows of S tokens and stride σ
(``eval.key_short_stride``, default S/4), shared by every length and protocol: each target is predicted from
between S − σ + 1 and S tokens (σ = 1: exactly S, the layers run over S tokens per target). A target is key
when

    |l(t)| > |s(t)|                                             (a candidate: there is context beyond s(t))
    LSD(t) = log p_θ0(x_t | l(t)) − log p_θ0(x_t | s(t)) > α       (the far context adds more than α nats)
    LCL(t) = log p_θ0(x_t | l(t)) > β                            (and with it θ0 predicts the target well)

and the row's perplexity is the scored model θ's (with the row's evaluation-time variation) over the key set K,
from the same long contexts:

    LongPPL = exp( −(1/|K|) Σ_{t ∈ K} log p_θ(x_t | l(t)) ).

A target whose long context is not longer than its short one has s(t) = l(t), so LSD = 0, which α ≥ 0 never
passes. α = 2 and β = −2 are the paper's (``eval.key_lsd_threshold``, ``eval.key_lcl_threshold``; strict
inequalities, as in its reference code). S is ``eval.key_short_length``, default train.seq_len. θ0 is the run
itself as configured, or another run (``eval.key_evaluator=<run dir>``, read from its last checkpoint and run
on this device and dtype): one parent for every compared run scores all of them on the same key tokens. Rows
record the measure, the settings and the evaluator (evaluation/results.py: KEY_SETTINGS), the key tokens found
(``tokens``), their share of the targets (``key_share``) and the candidates (``key_candidates``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from core.checkpoint_io import LAST, last_checkpoint_path
from core.domain import domain, read_with
from core.errors import PosGPTError
from core.rundir import CHECKPOINT_DIR
from data.tasks import NO_TASK
from evaluation.context import EvalContext, EvaluationPlan
from evaluation.extrapolation import effective_stride, scored_range, summarize, target_losses, window_plan
from evaluation.results import KEY_TOKENS
from evaluation.settings import TEXT, Batching, SlidingWindows, TokenBudget

if TYPE_CHECKING:  # importing the data package pulls in `datasets`, slow to import: annotations only
    from data import TokenArray

# The protocols whose targets' context is the contiguous run of tokens before them, of which the short context is
# the end; the streaming protocol's cache (sinks and a window) is not.
LONG_PROTOCOLS = ("nonoverlapping", "sliding")
SELF = "self"  # the evaluator of rows whose key tokens the scored run selected itself


KEY_TOKENS_ON = ("key_tokens", (True,))  # the settings eval.key_tokens=true reads (core.domain's used_with)


@dataclass(frozen=True, kw_only=True)
class KeyTokenSettings(SlidingWindows, TokenBudget, Batching):
    """The eval.* settings key-token perplexity reads: its own, and those it shares (evaluation/settings.py)."""

    # Key-token perplexity (LongPPL, Fang et al. 2025; evaluation/key_tokens.py): rows of perplexity over the targets
    # whose log-probability the evaluator finds more than key_lsd_threshold nats higher with the long context than
    # with a short one of key_short_length tokens, and above key_lcl_threshold with it
    key_tokens: bool = read_with(False, runs=TEXT)
    key_short_length: int | None = domain(None, ge=1, used_with=KEY_TOKENS_ON)  # S; None: train.seq_len
    key_short_stride: int | None = domain(None, ge=1, used_with=KEY_TOKENS_ON)  # contexts S-stride+1..S; None: S/4
    key_lsd_threshold: float = domain(2.0, ge=0, used_with=KEY_TOKENS_ON)  # alpha: nats the long context must add
    key_lcl_threshold: float = domain(-2.0, lt=0, used_with=KEY_TOKENS_ON)  # beta: log-probability with the long one
    # a run directory whose model selects the key tokens; None: the run itself
    key_evaluator: str | None = read_with(None, used_with=KEY_TOKENS_ON)

    def check(self, plan: EvaluationPlan) -> None:
        """Key-token perplexity needs text, a protocol whose context is the tokens before each target, a length
        longer than its short context, and an evaluator that is a run; its evaluator is read only with it."""
        if not (self.key_tokens or KEY_TOKENS in plan.evaluators):  # asked for by its switch or by name
            if self.key_evaluator is not None:
                raise PosGPTError(
                    f"eval.key_evaluator={self.key_evaluator} is read only when eval.key_tokens=true: add it or drop "
                    "eval.key_evaluator"
                )
            return
        if plan.task is not None:
            raise PosGPTError(f"eval.key_tokens scores text; this run was trained on task={plan.task.name}: drop it")
        if not set(self.protocols) & set(LONG_PROTOCOLS):
            raise PosGPTError(
                f"eval.key_tokens compares each target's context in the {' or '.join(LONG_PROTOCOLS)} protocol with "
                f"a short one; eval.protocols={list(self.protocols)} has neither: add one"
            )
        self._check_short_context(plan)
        if self.key_evaluator is not None:
            check_evaluator_dir(self.key_evaluator)

    def _check_short_context(self, plan: EvaluationPlan) -> None:
        """Some evaluated length must be longer than the short context, whose windows score at most all of it."""
        size = short_length(self.key_short_length, plan.train_len)
        stride = short_stride(self.key_short_stride, size)
        if not key_jobs(list(self.protocols), list(plan.lengths), size):
            raise PosGPTError(
                f"eval.key_tokens=true needs an evaluation length longer than its short context of {size} tokens "
                f"(eval.key_short_length, default train.seq_len); the lengths are {list(plan.lengths)}: add a longer "
                "one or lower eval.key_short_length"
            )
        if stride > size:
            raise PosGPTError(
                f"eval.key_short_stride={stride} exceeds the short context of {size} tokens (eval.key_short_length): "
                f"each short window scores its last stride targets, so at most {size}"
            )


def short_length(given: int | None, train_len: int) -> int:
    """S: eval.key_short_length (``given``), default the training length."""
    return given or train_len


def short_stride(given: int | None, size: int) -> int:
    """σ: eval.key_short_stride (``given``), default a quarter of S = ``size`` (at least 1)."""
    return given or max(1, size // 4)


def key_jobs(protocols: list[str], lengths: list[int], size: int) -> list[tuple[int, str]]:
    """The (length, protocol) pairs with key-token rows: lengths longer than S = ``size``, protocols of
    LONG_PROTOCOLS."""
    protocols = [protocol for protocol in dict.fromkeys(protocols) if protocol in LONG_PROTOCOLS]
    longer = [length for length in dict.fromkeys(lengths) if length > size]
    return [(length, protocol) for length in longer for protocol in protocols]


def select_key_tokens(
    long_loss: np.ndarray,
    long_context: np.ndarray,
    short_loss: np.ndarray,
    short_context: np.ndarray,
    lsd_threshold: float,
    lcl_threshold: float,
) -> np.ndarray:
    """The key targets (a boolean mask) from the evaluator's losses (−log p, nats) with the long and the short
    context and the number of tokens each context held. A loss that is not finite selects nothing."""
    lsd = short_loss - long_loss  # log p(x | long) − log p(x | short)
    return (long_context > short_context) & (lsd > lsd_threshold) & (-long_loss > lcl_threshold)


@dataclass
class SelectingModel:
    """The model that selects the key tokens: ``name`` SELF (the scored run) or the other run's directory, and the
    step of the checkpoint it was read from (None for SELF: the scored checkpoint's)."""

    model: torch.nn.Module
    name: str
    step: int | None


def load_evaluator(ctx: EvalContext, given: str | None) -> SelectingModel:
    """The scored run itself (eval.key_evaluator unset: ``given`` None), or the run it names, built from its own
    checkpoint's config and weights; PosGPTError for a directory without a checkpoint or a task run."""
    if given is None:
        return SelectingModel(ctx.model, SELF, None)
    check_evaluator_dir(given)
    model, task, step = ctx.open_run(given)
    if task != NO_TASK:
        raise PosGPTError(
            f"eval.key_evaluator={given} was trained on task={task}, whose tokens are the task's own: the "
            "evaluator must be a language-model run (GPT-2 tokens)"
        )
    return SelectingModel(model.to(ctx.device).eval(), str(Path(given).resolve()), step)


def check_evaluator_dir(given: str) -> None:
    """PosGPTError unless eval.key_evaluator is a run directory with a checkpoint (checked before any work)."""
    if not last_checkpoint_path(given).is_file():
        raise PosGPTError(
            f"eval.key_evaluator={given} is not a training run directory with {CHECKPOINT_DIR}/{LAST}: name the run "
            "whose model selects the key tokens, or drop it (the run itself selects them)"
        )


@dataclass
class KeySet:
    """The key tokens of one (length, protocol): their mask over the targets and the candidates' number, with the
    evaluator's long-context losses (the scored model's too when it is the evaluator); or why there are none."""

    mask: np.ndarray | None = None
    candidates: int = 0
    long_loss: np.ndarray | None = field(default=None, repr=False)
    seconds: float = 0.0
    reason: str | None = None


@dataclass
class KeyTokenSelection:
    """What the evaluator selected, once for every variation scored: the row fields of its settings, the targets
    [first, first + n), and per (length, protocol) its KeySet. ``reuse``: the evaluator is the scored model as
    configured and no other variation is scored, so its long-context losses are the scored model's."""

    settings: dict[str, Any]
    span: tuple[int, int] | None
    sets: dict[tuple[int, str], KeySet]
    reuse: bool

    def rows(self, ctx: EvalContext, tokens: TokenArray, s: KeyTokenSettings) -> list[dict[str, Any]]:
        """A key-token row per (length, protocol), scored with ``ctx.model`` as it is now (the variation applied)."""
        rows = []
        for (length, protocol), key_set in self.sets.items():
            stride = effective_stride(length, s.stride) if protocol == "sliding" else None
            row = {"length": length, "protocol": protocol, "stride": stride, "measure": KEY_TOKENS, **self.settings}
            reason = key_set.reason or ctx.model.pe.beyond_reach(length)
            if reason:
                rows.append({**row, "tokens": 0, "loss": None, "ppl": None, "reason": reason})
                continue
            started, first, n_targets = time.perf_counter(), *self.span
            losses = key_set.long_loss
            if not self.reuse:
                plan = window_plan(first, n_targets, length, protocol, s.stride)
                what = f"L={length} {protocol} key tokens"
                losses = target_losses(
                    ctx.model, tokens, plan, s.batch_tokens, ctx.device, ctx.dtype, ctx.progress, what
                )[0]
            row.update(key_summary(losses, key_set.mask, key_set.candidates))
            seconds = key_set.seconds + time.perf_counter() - started
            rows.append({**row, "target_range": [first, first + n_targets], "seconds": round(seconds, 3)})
        return rows


def key_summary(losses: np.ndarray, mask: np.ndarray, candidates: int) -> dict[str, Any]:
    """A key-token row's numbers: the key tokens' count, mean loss and perplexity (extrapolation.summarize's, so a
    loss that is not finite or a perplexity too large for a float reads as in other rows), their share of the
    targets and the candidates' count; no key token at all is a row without perplexity, and says so."""
    found = int(mask.sum())
    counts = {"key_share": found / len(mask), "key_candidates": candidates}
    if found == 0:
        reason = f"no key tokens among the {candidates} targets with context beyond the short one"
        return {"tokens": 0, "loss": None, "ppl": None, "reason": reason, **counts}
    total = torch.tensor([losses[mask].sum()], dtype=torch.float64)
    summary = summarize(total, torch.tensor([float(found)], dtype=torch.float64))
    return {key: value for key, value in summary.items() if not key.startswith("per_position")} | counts


def find_key_tokens(ctx: EvalContext, tokens: TokenArray, e: KeyTokenSettings) -> KeyTokenSelection:
    """The evaluator's key tokens at every (length, protocol) of key_jobs: one short-context pass over the targets,
    then per pair the long-context pass and the selection. Printed: what each pair found."""
    evaluator = load_evaluator(ctx, e.key_evaluator)
    evaluator.model.eval()
    size = short_length(e.key_short_length, ctx.train_len)
    stride = short_stride(e.key_short_stride, size)
    settings = {
        "key_short_length": size,
        "key_short_stride": stride,
        "key_lsd_threshold": float(e.key_lsd_threshold),
        "key_lcl_threshold": float(e.key_lcl_threshold),
        "key_evaluator": evaluator.name,
        "key_evaluator_step": evaluator.step,
    }
    span = scored_range(len(tokens), ctx.lengths, e.max_tokens)
    jobs = key_jobs(list(e.protocols), ctx.lengths, size)
    reuse = evaluator.name == SELF and not ctx.variation_names
    if not jobs:  # KeyTokenSettings.check refuses this before any work
        return KeyTokenSelection(settings, span, {}, reuse)
    if span is None or all(length > span[0] for length, _ in jobs):  # every row says why (no targets)
        unscored = {job: unscorable(job[0], len(tokens), e.max_tokens) for job in jobs}
        return KeyTokenSelection(settings, span, unscored, reuse)
    if reason := evaluator.model.pe.beyond_reach(size):
        raise PosGPTError(f"eval.key_short_length={size}: the key-token evaluator cannot score it ({reason}); lower it")
    started = time.perf_counter()
    short_plan = window_plan(*span, size, "sliding", stride)
    short = target_losses(
        evaluator.model, tokens, short_plan, e.batch_tokens, ctx.device, ctx.dtype, ctx.progress, f"short {size}"
    )
    shared = (time.perf_counter() - started) / len(jobs)  # the short pass, shared by every pair's rows
    sets = {job: key_set(ctx, e, evaluator, tokens, job, span, short, shared) for job in jobs}
    print(selection_note(settings, span, sets), flush=True)
    return KeyTokenSelection(settings, span, sets, reuse)


def unscorable(length: int, n_tokens: int, max_tokens: int) -> KeySet:
    """The KeySet of a length the split or eval.max_tokens leaves no targets for (extrapolation's reason)."""
    return KeySet(
        reason=f"needs 2x{length} tokens in the split ({n_tokens}) and eval.max_tokens ({max_tokens}) >= {length}"
    )


def key_set(
    ctx: EvalContext,
    e: KeyTokenSettings,
    evaluator: SelectingModel,
    tokens: TokenArray,
    job: tuple[int, str],
    span: tuple[int, int],
    short: tuple[np.ndarray, np.ndarray],
    shared_seconds: float,
) -> KeySet:
    """The evaluator's long-context pass at one (length, protocol) and the key tokens it selects."""
    length, protocol = job
    if reason := evaluator.model.pe.beyond_reach(length):
        return KeySet(reason=f"the key-token evaluator cannot score length {length}: {reason}")
    if length > span[0]:  # span[0] is the longest length that fits
        return unscorable(length, len(tokens), e.max_tokens)
    started = time.perf_counter()
    plan = window_plan(*span, length, protocol, e.stride)
    long_loss, long_context = target_losses(
        evaluator.model, tokens, plan, e.batch_tokens, ctx.device, ctx.dtype, ctx.progress, f"L={length} {protocol}"
    )
    mask = select_key_tokens(long_loss, long_context, *short, e.key_lsd_threshold, e.key_lcl_threshold)
    candidates = int((long_context > short[1]).sum())
    return KeySet(mask, candidates, long_loss, shared_seconds + time.perf_counter() - started)


def selection_note(settings: dict[str, Any], span: tuple[int, int], sets: dict[tuple[int, str], KeySet]) -> str:
    """The console's account of the selection: the settings, then per (length, protocol) the key tokens found."""
    size, stride = settings["key_short_length"], settings["key_short_stride"]
    evaluator = settings["key_evaluator"]
    if evaluator != SELF:
        evaluator += f" (step {settings['key_evaluator_step']})"
    found = "; ".join(
        f"{length} {protocol}: "
        + (key_set.reason if key_set.mask is None else f"{int(key_set.mask.sum()):,} ({key_set.mask.mean():.2%})")
        for (length, protocol), key_set in sets.items()
    )
    return (
        f"eval: key tokens (LSD > {settings['key_lsd_threshold']:g}, LCL > {settings['key_lcl_threshold']:g}; short "
        f"context {size - stride + 1}-{size} tokens; evaluator {evaluator}) among {span[1]:,} targets: {found}"
    )
