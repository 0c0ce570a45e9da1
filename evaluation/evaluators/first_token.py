"""Attention on the first token, the attention sink's measure (Xiao et al. 2024; Qiu et al. 2025, "Gated Attention
for Large Language Models", report it per layer): ``eval.evaluators=[first_token]``.

For query i >= 1 of a window of L tokens, head h of layer l gives the first token the probability p_lh[i, 0]. A
row, per length and variation, holds its mean over the layers, heads and queries 1 .. L-1 of the first
``eval.max_tokens // L`` windows of the scored split (at least one; query 0 can attend only to itself and is left
out), ``first_token_mass``, and the same mean per layer, ``first_token_mass_by_layer``. A softmax that spreads a
query's attention uniformly gives 1/(i+1) to its first token, so the mean over queries of a window is
(H_L - 1)/(L - 1), H_L the L-th harmonic number, which falls with L: a sink keeps it high where it would fall. The
probabilities come from the written-out attention (``GPT.hidden_states(..., capture=...)``), one window at a time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from core.runtime import autocast
from data import TokenArray
from evaluation.context import EvalContext
from evaluation.evaluator import Evaluator
from evaluation.evaluators.perplexity import scored_fields
from evaluation.settings import TokenBudget
from evaluation.value_format import value_rows

VALUE = "first_token_mass"


@dataclass(frozen=True, kw_only=True)
class FirstTokenSettings(TokenBudget):
    """The eval.* settings the first-token measure reads: the scored tokens' budget (evaluation/settings.py)."""


def first_token_mass(
    model: torch.nn.Module, windows: torch.Tensor, device: torch.device, dtype: torch.dtype
) -> list[float]:
    """Per layer, the mean over windows (rows of ``windows``), heads and queries 1 .. L-1 of the attention
    probability on the window's first token."""
    probs: list[torch.Tensor] = []
    with torch.no_grad(), autocast(device, dtype):
        model.hidden_states(windows.to(device), capture=probs)
    return [p[..., 1:, 0].double().mean().item() for p in probs]  # (B, H, L, L): queries 1.., key 0


class FirstToken(Evaluator):
    name = "first_token"
    runs = "text"
    order = 1  # after perplexity: a measure of the model it scored
    Settings = FirstTokenSettings
    recorded = ("max_tokens",)
    rows = value_rows("first_token", VALUE)

    @classmethod
    def requested(cls, section: Mapping[str, Any]) -> bool:
        return False  # eval.evaluators=[first_token] asks for it

    def run(self, ctx: EvalContext, tokens: TokenArray | None) -> list[dict[str, Any]]:
        rows = []
        for _, fields in ctx.variations():
            for length in dict.fromkeys(ctx.lengths):
                row = {"length": length, **fields, **scored_fields(ctx, tokens)}
                n_windows = min(max(1, self.settings.max_tokens // length), len(tokens) // length)
                reason = ctx.model.pe.beyond_reach(length) or (None if n_windows else "the split is shorter")
                if reason:
                    rows.append({**row, VALUE: None, "tokens": 0, "reason": reason})
                    continue
                starts = range(0, n_windows * length, length)
                by_layer = np.zeros(len(ctx.model.blocks))
                for start in starts:  # one window at a time: a layer's (H, L, L) probabilities each
                    window = torch.from_numpy(tokens.read(start, length).astype(np.int64))[None]
                    by_layer += first_token_mass(ctx.model, window, ctx.device, ctx.dtype)
                by_layer /= n_windows
                rows.append(
                    {**row, VALUE: float(by_layer.mean()), f"{VALUE}_by_layer": by_layer.tolist(), "windows": n_windows}
                    | {"tokens": n_windows * length}
                )
        return rows
