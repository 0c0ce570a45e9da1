"""Key-token perplexity (LongPPL, ``eval.key_tokens=true``; evaluation/key_tokens.py): the evaluator model selects
the key tokens once, then every variation of the scored run is scored on them; rows into eval/extrapolation.json
with ``"measure": "key_tokens"``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from data import TokenArray
from evaluation.context import EvalContext
from evaluation.evaluator import Evaluator
from evaluation.evaluators.perplexity import score_protocols
from evaluation.key_tokens import KeyTokenSettings, find_key_tokens
from evaluation.perplexity_format import PERPLEXITY_ROWS
from evaluation.results import KEY_TOKENS


class KeyTokens(Evaluator):
    name = KEY_TOKENS
    runs = "text"
    Settings = KeyTokenSettings
    recorded = (
        "max_tokens",
        "batch_tokens",
        "key_short_length",
        "key_short_stride",
        "key_lsd_threshold",
        "key_lcl_threshold",
        "key_evaluator",
    )
    rows = PERPLEXITY_ROWS

    @classmethod
    def requested(cls, section: Mapping[str, Any]) -> bool:
        return bool(section["key_tokens"])

    def run(self, ctx: EvalContext, tokens: TokenArray | None) -> list[dict[str, Any]]:
        s = self.settings
        selection = find_key_tokens(ctx, tokens, s)  # before any variation is applied to the model
        more = lambda ctx, tokens: selection.rows(ctx, tokens, s)  # noqa: E731
        return score_protocols(ctx, tokens, [], s.stride, s.max_tokens, s.batch_tokens, more=more)

    def header(self, ctx: EvalContext) -> dict[str, Any]:
        return {"data": ctx.data.name}
