"""Perplexity in the streaming protocol (StreamingLLM; ``eval.protocols=[..., streaming]``): a KV cache of the first
``eval.streaming_sinks`` tokens and the most recent ones (evaluation/streaming.py), into eval/extrapolation.json."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.domain import domain
from core.errors import PosGPTError
from data import TokenArray
from evaluation.context import EvalContext, EvaluationPlan
from evaluation.evaluator import Evaluator
from evaluation.evaluators.perplexity import score_protocols
from evaluation.perplexity_format import PERPLEXITY_ROWS
from evaluation.settings import TEXT, Batching, Protocols, TokenBudget

STREAMING = "streaming"


@dataclass(frozen=True, kw_only=True)
class StreamingSettings(Protocols, TokenBudget, Batching):
    """The eval.* settings the streaming protocol reads: its own, and those it shares (evaluation/settings.py)."""

    # streaming protocol only: the first k tokens kept; the window is length - k
    streaming_sinks: int = domain(4, ge=0, used_with=("protocols", (STREAMING,)), runs=TEXT)

    def check(self, plan: EvaluationPlan) -> None:
        """The streaming cache holds the sinks and length - sinks recent tokens: some must be left at every length."""
        shortest = min(plan.lengths)
        if STREAMING in self.protocols and self.streaming_sinks >= shortest:
            raise PosGPTError(
                f"eval.streaming_sinks={self.streaming_sinks} leaves no window of recent tokens at length {shortest} "
                "(the streaming cache holds the sinks and length - sinks recent tokens): lower it below every length"
            )


class Streaming(Evaluator):
    name = STREAMING
    runs = "text"
    Settings = StreamingSettings
    recorded = ("max_tokens", "batch_tokens", "streaming_sinks")
    rows = PERPLEXITY_ROWS

    @classmethod
    def requested(cls, section: Mapping[str, Any]) -> bool:
        return STREAMING in section["protocols"]

    def run(self, ctx: EvalContext, tokens: TokenArray | None) -> list[dict[str, Any]]:
        s = self.settings
        return score_protocols(ctx, tokens, [STREAMING], None, s.max_tokens, s.batch_tokens, s.streaming_sinks)

    def header(self, ctx: EvalContext) -> dict[str, Any]:
        return {"data": ctx.data.name}
