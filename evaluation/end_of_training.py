"""The evaluation at the end of training (train.eval_after), as the planner hands it to the training loop
(training.loop.EndEvaluation): its evaluators, selected and checked, and the evaluation's planned settings
(:class:`evaluation.context.EvaluationPlan`), so that the loop runs it from what was planned and reads no config."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from core.errors import PosGPTError
from core.rundir import EVAL_DIR
from evaluation.context import EvaluationPlan, OpenRun
from evaluation.evaluator import Evaluator
from evaluation.extrapolation import scored_range


class EndOfTrainingEvaluation:
    """``plan``: what the evaluation reads of the run's config; ``evaluators``: its evaluators, checked against the
    model planned on the meta device; ``settings``: the eval section as the run's checkpoints record it;
    ``max_tokens``: eval.max_tokens; ``open_run``: how an evaluator opens another run (eval.key_evaluator)."""

    def __init__(
        self,
        plan: EvaluationPlan,
        evaluators: Sequence[Evaluator],
        settings: dict[str, Any],
        max_tokens: int | None,
        open_run: OpenRun,
    ) -> None:
        self.plan, self.evaluators, self.settings = plan, tuple(evaluators), settings
        self.max_tokens, self.open_run = max_tokens, open_run

    def check_split(self, val_tokens) -> None:
        """PosGPTError when it would score nothing of ``val_tokens``: checked before the run directory is written."""
        lengths = list(self.plan.lengths)
        if scored_range(len(val_tokens), lengths, self.max_tokens) is None:
            raise PosGPTError(
                f"the evaluation after training would score nothing: the {val_tokens.name} split has "
                f"{len(val_tokens):,} tokens and each evaluation length needs twice its own (the shortest, "
                f"{min(lengths)}, needs {2 * min(lengths)}); lower eval.lengths (or eval.length_multipliers), add "
                "data, or set train.eval_after=false"
            )

    def done(self, run_dir: Path, step: int, trained: dict) -> bool:
        """Whether every results file the evaluators write records this step (a run stopped between them: not), and
        this evaluation: the one the run was trained with (``trained``'s eval section, which its end ran), or one
        whose every evaluator has rows at every length planned here. So eval settings given anew (other lengths,
        say) are evaluated, not taken for done."""
        from evaluation.run import by_file
        from evaluation.store import load_document

        as_trained = trained.get("eval") == self.settings
        for group in by_file(list(self.evaluators)).values():
            document = load_document(run_dir / EVAL_DIR, group[0].rows) or {}
            if document.get("step") != step:
                return False
            scored = {(group[0].rows.evaluator_of(row), row["length"]) for row in document.get("results", [])}
            if not as_trained and any((e.name, n) not in scored for e in group for n in self.plan.lengths):
                return False
        return True

    def run(
        self,
        model: torch.nn.Module,
        run_dir: Path,
        device: torch.device,
        dtype: torch.dtype,
        val_tokens,
        step: int,
        trained: dict,
        wandb_run: Any,
    ) -> None:
        """Evaluate ``model``, trained ``step`` steps with the config ``trained``, into ``run_dir``."""
        from evaluation.run import check_evaluators, evaluate_run

        context = self.plan.context(model, run_dir, device, dtype, trained, step, wandb_run, self.open_run)
        check_evaluators(context, list(self.evaluators))  # what needs the trained model and the run's results
        evaluate_run(context, val_tokens, list(self.evaluators))
