"""The zero-shot copy probe of a language-model run (``eval.tasks=[copy_probe]``; evaluation/copy_probe.py), into
eval/tasks.json as ``task: copy_probe``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from data import TokenArray
from evaluation.context import EvalContext
from evaluation.copy_probe import NAME, ProbeSettings, probe_candidates, probe_rows
from evaluation.evaluator import Evaluator
from evaluation.evaluators.task_accuracy import with_effective_lengths
from evaluation.task_accuracy import TASK_ROWS

ACCURACY = "exact match of the repeat's tokens after its first (teacher forcing); 95% Wilson intervals"


class CopyProbe(Evaluator):
    name = NAME
    runs = "text"
    order = 1  # after perplexity: a probe of the model perplexity scored
    Settings = ProbeSettings
    recorded = ("copy_span", "copy_min_count", "task_half_width", "batch_tokens")
    rows = TASK_ROWS
    candidates: torch.Tensor | None = None

    @classmethod
    def requested(cls, section: Mapping[str, Any]) -> bool:
        return NAME in section["tasks"]

    def check(self, ctx: EvalContext) -> None:
        """The tokens the span is drawn from (counted in the training split): refused when too few."""
        s = self.settings
        self.candidates = probe_candidates(ctx.data, s.copy_min_count, ctx.model.vocab_size, ctx.progress)

    def run(self, ctx: EvalContext, tokens: TokenArray | None) -> list[dict[str, Any]]:
        return probe_rows(ctx, self.settings, tokens, self.candidates)

    def header(self, ctx: EvalContext) -> dict[str, Any]:
        s = self.settings
        counts = {"copy_span": s.copy_span, "copy_min_count": s.copy_min_count, "copy_candidates": len(self.candidates)}
        return {"task": NAME, "accuracy": ACCURACY, **counts}

    def finish(self, document: dict[str, Any]) -> dict[str, Any]:
        return with_effective_lengths(document, self.settings.task_threshold)
