"""Accuracy of a task run by length (and passkey's depth), into eval/tasks.json (evaluation/task_accuracy.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from data import TokenArray
from data.tasks import build_task
from evaluation.context import EvalContext
from evaluation.evaluator import Evaluator
from evaluation.task_accuracy import TASK_ROWS, TaskSettings, effective_lengths, evaluate_task

ACCURACY = "exact match of all answer tokens, greedy under teacher forcing; 95% Wilson intervals"


class TaskAccuracy(Evaluator):
    name = "task_accuracy"
    runs = "task"
    Settings = TaskSettings
    recorded = ("task_half_width", "random_positions", "batch_tokens")
    rows = TASK_ROWS

    @classmethod
    def requested(cls, section: Mapping[str, Any]) -> bool:
        return True  # every task run is scored on its task

    def run(self, ctx: EvalContext, tokens: TokenArray | None) -> list[dict[str, Any]]:
        ctx.model.eval()
        return evaluate_task(ctx, build_task(ctx.task), self.settings)

    def header(self, ctx: EvalContext) -> dict[str, Any]:
        return {"task": ctx.task.name, "task_config": dataclasses.asdict(ctx.task), "accuracy": ACCURACY}

    def finish(self, document: dict[str, Any]) -> dict[str, Any]:
        return with_effective_lengths(document, self.settings.task_threshold)


def with_effective_lengths(document: dict[str, Any], threshold: float) -> dict[str, Any]:
    """The document with the threshold and, per variation, the effective length over all its rows."""
    return {**document, "threshold": threshold, "effective_length": effective_lengths(document["results"], threshold)}
