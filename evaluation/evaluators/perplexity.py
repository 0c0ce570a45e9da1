"""Perplexity by length in the nonoverlapping and sliding protocols (evaluation/extrapolation.py), into
eval/extrapolation.json.

Each of the scheme's evaluation-time variations asked for (``eval.variations``, else the run as configured) is
scored at every length and protocol; each row records its variation, what it scored (the corpus by name and by the
digest of its tokens, the split, the targets) and what computed it (the attention backend that ran, the dtype).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from core.domain import domain
from core.errors import PosGPTError
from data import TokenArray, describe_corpus
from evaluation.context import EvalContext, EvaluationPlan
from evaluation.evaluator import Evaluator
from evaluation.extrapolation import evaluate_extrapolation
from evaluation.key_tokens import LONG_PROTOCOLS
from evaluation.perplexity_format import PERPLEXITY_ROWS
from evaluation.results import row_ppl
from evaluation.settings import TEXT, Batching, SlidingWindows, TokenBudget
from evaluation.streaming import DEFAULT_SINKS

# What else a variation's rows are: key-token rows (evaluation/evaluators/key_tokens.py) add theirs per variation.
MoreRows = Callable[[EvalContext, TokenArray], list[dict[str, Any]]]


@dataclass(frozen=True, kw_only=True)
class PerplexitySettings(SlidingWindows, TokenBudget, Batching):
    """The eval.* settings perplexity reads: its own, and those it shares (evaluation/settings.py)."""

    # drawn in per_position.png; None: the longest
    per_position_plot_lengths: tuple[int, ...] | None = domain(None, ge=1, runs=TEXT)

    def check(self, plan: EvaluationPlan) -> None:
        """per_position.png draws evaluated lengths only."""
        not_evaluated = sorted(set(self.per_position_plot_lengths or []) - set(plan.lengths))
        if not_evaluated:
            raise PosGPTError(
                f"eval.per_position_plot_lengths names {not_evaluated}, which are not evaluated (the lengths are "
                f"{list(plan.lengths)}): choose among them"
            )


class Perplexity(Evaluator):
    """Perplexity in each of ``eval.protocols`` whose context is the tokens before each target."""

    name = "perplexity"
    runs = "text"
    Settings = PerplexitySettings
    recorded = ("max_tokens", "batch_tokens")
    rows = PERPLEXITY_ROWS

    @classmethod
    def requested(cls, section: Mapping[str, Any]) -> bool:
        return any(protocol in LONG_PROTOCOLS for protocol in section["protocols"])

    def run(self, ctx: EvalContext, tokens: TokenArray | None) -> list[dict[str, Any]]:
        s = self.settings
        protocols = [protocol for protocol in s.protocols if protocol in LONG_PROTOCOLS]
        rows = score_protocols(ctx, tokens, protocols, s.stride, s.max_tokens, s.batch_tokens)
        if rows and all(row_ppl(row) is None for row in rows):
            shortest = min(rows, key=lambda row: row["length"])
            print(
                f"eval: nothing could be scored on {ctx.data.name} ({tokens.name} split, {len(tokens):,} tokens); "
                f"at the shortest length, {shortest['length']}: {shortest['reason']}",
                flush=True,
            )
        return rows

    def header(self, ctx: EvalContext) -> dict[str, Any]:
        return {"data": ctx.data.name}

    def plot_options(self) -> dict[str, Any]:
        lengths = self.settings.per_position_plot_lengths
        return {"per_position_plot_lengths": list(lengths) if lengths else None}


def scored_fields(ctx: EvalContext, tokens: TokenArray) -> dict[str, Any]:
    """What a perplexity row scored: the corpus by name, description and content, and the split."""
    return {
        "data": ctx.data.name,
        "corpus": describe_corpus(ctx.data),
        "split": tokens.name,
        "split_digest": tokens.digest,
    }


def score_protocols(
    ctx: EvalContext,
    tokens: TokenArray,
    protocols: list[str],
    stride: int | None,
    max_tokens: int,
    batch_tokens: int,
    sinks: int = DEFAULT_SINKS,
    more: MoreRows | None = None,
) -> list[dict[str, Any]]:
    """Rows for every evaluation-time variation, length and protocol (and ``more`` rows per variation), each
    recording what it scored and what computed it (the attention backend that ran, the dtype)."""
    scored_what, dtype = scored_fields(ctx, tokens), str(ctx.dtype).removeprefix("torch.")
    rows = []
    for label, fields in ctx.variations():
        backend = ctx.model.attention_backend(ctx.device, dtype=ctx.dtype)
        scored = []
        if protocols:
            scored = evaluate_extrapolation(
                ctx.model,
                tokens,
                ctx.lengths,
                protocols,
                stride,
                max_tokens,
                batch_tokens,
                ctx.device,
                ctx.dtype,
                progress=ctx.progress,
                description=label,
                sinks=sinks,
            )
        scored += more(ctx, tokens) if more is not None else []
        setting = {**fields, **scored_what, "attn_backend": backend, "dtype": dtype}  # a variation may change it
        rows += [
            {"length": r["length"], "protocol": r["protocol"], "stride": r["stride"], **setting, **r} for r in scored
        ]
    return rows
