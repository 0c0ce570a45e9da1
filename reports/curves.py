"""Validation loss during training over seeds (each run's metrics.jsonl): the table and the curves to plot."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.errors import PosGPTError
from core.text import markdown_text
from core.tracking import METRICS_FILE, read_metrics
from evaluation.stats import Estimate, mean_ci
from reports.runs import Run, group_labels
from reports.tables import estimate_table


@dataclass
class ValidationCurve:
    """One setting's validation loss during training: {step: mean ± CI over its seeds}."""

    label: str
    scheme: str
    seeds: int
    by_step: dict[int, Estimate]
    runtimes: list[str] = field(default_factory=list)  # the attention backends and dtypes its seeds trained with


def validation_curves(groups: list[list[Run]]) -> list[ValidationCurve]:
    """Per setting, the validation loss each seed logged (metrics.jsonl), at the steps every seed logged."""
    curves = []
    for group, label in zip(groups, group_labels(groups)):
        per_seed, runtimes = [], {}
        for run in group:
            records = read_metrics(run.dir)
            logged = {
                record["step"]: record["val_loss"] for record in records if record.get("val_loss") is not None
            }  # a resumed run's repeated step: its last record
            # each start of a run records its backend and dtype (training/metrics.py); a record without them names none
            runtimes.update({f"{r['attn_backend']}, {r['dtype']}": None for r in records if "attn_backend" in r})
            if not logged:
                raise PosGPTError(
                    f"{run.dir / METRICS_FILE} has no validation loss (train.val_every); "
                    "leave out --val-curve or this run"
                )
            per_seed.append(logged)
        steps = sorted(set.intersection(*(set(logged) for logged in per_seed)))
        if not steps:
            raise PosGPTError(
                f"{label}: its seeds logged validation loss at no common step (train.val_every "
                "differs); leave out --val-curve or compare runs logged alike"
            )
        curves.append(
            ValidationCurve(
                label,
                group[0].pe,
                len(group),
                {step: mean_ci([logged[step] for logged in per_seed]) for step in steps},
                list(runtimes),
            )
        )
    return curves


def validation_report(curves: list[ValidationCurve]) -> str:
    """The validation-loss table: a column per logged step, the lowest mean of each column in bold."""
    steps = sorted({step for curve in curves for step in curve.by_step})
    rows = [(curve.label, curve.seeds, [curve.by_step.get(step, "-") for step in steps]) for curve in curves]
    return (
        "\n".join(
            [
                "Validation loss during training (nats; the run's validation split at the training length, "
                "train.val_batches batches; mean over seeds ± half-width of the 95% CI), by training step:",
                "",
                estimate_table(rows, [str(step) for step in steps], digits=3),
                *training_runtime_note(curves),
            ]
        )
        + "\n"
    )


def training_runtime_note(curves: list[ValidationCurve]) -> list[str]:
    """The attention backend and dtype each setting trained with (metrics.jsonl), where recorded; a setting
    whose seeds trained otherwise is named (they are seeds of one setting: neither changes the trained model's
    definition, but a dtype changes its numbers)."""
    recorded = [curve for curve in curves if curve.runtimes]
    if not recorded:
        return []
    kinds = {runtime for curve in recorded for runtime in curve.runtimes}
    if len(kinds) == 1:
        return ["", f"Trained with attention backend and dtype {next(iter(kinds))} (every run that records it)."]
    return [
        "",
        "Trained with attention backend and dtype: "
        + "; ".join(
            f"{markdown_text(curve.label)}: {' / '.join(curve.runtimes)}"
            + (" (its seeds differ: pooled above)" if len(curve.runtimes) > 1 else "")
            for curve in recorded
        )
        + ".",
    ]
