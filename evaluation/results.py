"""Extrapolation results as files: ``extrapolation.json`` (accumulated), ``extrapolation.csv``, text tables.

The JSON document describes one checkpoint (``"format"``: the version of the format, evaluation/migrate.py):

    {"format": 2, "pe": "rope", "train_seq_len": 64, "step": 1500, "data": "python_stdlib",
     "config": {"model": {...}, ...},
     "results": [{"length": 512, "protocol": "sliding", "stride": 256, "variation": "yarn:8",
                  "variation_settings": {"scaling": {"type": "yarn", ...}}, "data": "python_stdlib",
                  "tokens": 32768, "loss": 3.1, "ppl": 22.2,
                  "target_range": [512, 33280], "per_position_loss": [...], "peak_memory_mb": 812.5,
                  "memory_metric": "cpu_peak_rss", "seconds": 4.2}, ...]}

The top-level "data" is the latest evaluation's; each row names its own. "config" is the checkpoint's: the
resolved configuration the model was trained with (model, scheme, data, seed, ...), so that the file says
what produced its numbers without the checkpoint (null where the document never recorded it). A row that
could not be scored (learned beyond its table, too little data, a loss that is not finite) has ``"ppl"``
null and a ``"reason"``; a row whose loss is finite but whose perplexity exp(loss) is too large for a float
(a diverged model) keeps its ``"loss"``, has ``"ppl"`` null and a reason, and is read as ppl = inf
(row_ppl). ``"variation"`` labels the scheme's evaluation-time variation ("" for none: the run as
configured) and ``"variation_settings"`` holds its settings (model/pe/base.py).

What a row scored (its identity, beyond length and setting): ``"data"`` (the corpus's name), ``"corpus"``
(where it comes from, in words), ``"split"`` (val, train or all), ``"split_digest"`` (sha256 of the scored
split's token shards and range, from the token cache's checksums: the content itself) and
``"target_range"`` (the targets [F, F + N) of the split every length is scored on); and what computed it:
``"attn_backend"`` (the backend that ran, the model's attention_backend) and ``"dtype"``. A row
without the digest, backend or dtype has them "unrecorded": its content is identified by its data name and corpus
description, and never taken to equal a row whose digest is known.

Accumulation: each evaluation of the same checkpoint replaces the rows with the same key (row_key: what
they scored, by content, split and targets; backend and dtype; length, protocol, stride and variation settings)
and keeps the others, so ``eval.py`` runs with different variations, strides, data or lengths add up, and a row
of another corpus or split is never replaced; an evaluation of another checkpoint (another training step)
starts the file afresh, since the old rows describe another model. ``eval.py`` prints what it replaced.

Key-token perplexity (evaluation/key_tokens.py, eval.key_tokens=true) adds rows of the same schema with
``"measure": "key_tokens"`` (plain perplexity rows have none): ``tokens``, ``loss`` and ``ppl`` over the key tokens
only, ``key_share`` (their share of the targets), ``key_candidates`` (targets whose context reached beyond the short
one) and what selected them (KEY_SETTINGS: the short context and its stride, the thresholds, the evaluator and its
step), all part of row_key; they have no per-position losses. Tables label them (key_label), plots leave them out.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from evaluation.extrapolation import effective_stride, perplexity
from evaluation.stats import Estimate
from model.temperature import temperature_label

# What a key-token row was selected with: a row of other settings is another measurement (row_key, key_label).
KEY_SETTINGS = (
    "key_short_length",
    "key_short_stride",
    "key_lsd_threshold",
    "key_lcl_threshold",
    "key_evaluator",
    "key_evaluator_step",
)
CSV_COLUMNS = [
    "data",
    "length",
    "multiple",
    "protocol",
    "stride",
    "sinks",
    "window",
    "variation",
    "attn_temperature",
    "tokens",
    "loss",
    "ppl",
    "peak_memory_mb",
    "memory_metric",
    "seconds",
    "reason",
    "split",
    "split_digest",
    "attn_backend",
    "dtype",
    "measure",
    "key_share",
    "key_candidates",
    *KEY_SETTINGS,
]
# A row of key-token perplexity (evaluation/key_tokens.py) says so in "measure"; a row without one is plain perplexity.
KEY_TOKENS = "key_tokens"
# The zero-shot probes of a language-model run (evaluation/copy_probe.py): eval.tasks, rows of eval/tasks.json.
COPY_PROBE = "copy_probe"
PROBES = (COPY_PROBE,)
JSON_FILE = "extrapolation.json"
CSV_FILE = "extrapolation.csv"
ROW_REQUIRED = frozenset({"length", "protocol", "stride", "ppl"})  # what every reader of a row relies on


def scored_identity(row: dict[str, Any]) -> tuple:
    """What a row measured beyond its length and setting: (content, split, backend, dtype, targets).

    The content is the split's digest; without one (a row that never recorded it) it is "unrecorded",
    named by the row's data name and corpus description, and so never equal to a recorded one. The targets
    are the row's target_range, None for a row that scored nothing (not evaluable at its length)."""
    digest = row.get("split_digest")
    content = ("digest", digest) if digest else ("unrecorded", row.get("data"), row.get("corpus"))
    targets = tuple(row["target_range"]) if row.get("target_range") else None
    return (content, row.get("split"), row.get("attn_backend"), row.get("dtype"), targets)


def group_by_scored(rows: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """Rows by scored_identity. A row that scored nothing (no targets: the scheme cannot run at its length,
    or the split is too short for it) could be scored on no targets of its split, so it joins every group
    of its content, split, backend and dtype (one of its own where there is none)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda row: not row.get("target_range")):  # scored rows first
        identity = scored_identity(row)
        if identity[-1] is not None:
            groups.setdefault(identity, []).append(row)
            continue
        same_split = [key for key in groups if key[:-1] == identity[:-1]]
        for key in same_split or [identity]:
            groups.setdefault(key, []).append(row)
    return groups


def provenance(row: dict[str, Any]) -> dict[str, str | None]:
    """What a row scored and what computed it, as short words for labels (targets None: nothing scored)."""
    digest, targets = row.get("split_digest"), row.get("target_range")
    return {
        "data": str(row.get("data")),
        "corpus": f"corpus {digest[:10]}" if digest else f"corpus unrecorded ({row.get('corpus')})",
        "split": f"split {row.get('split')}",
        "targets": f"targets [{targets[0]}, {targets[1]})" if targets else None,
        "backend": row.get("attn_backend") or "backend unrecorded",
        "dtype": row.get("dtype") or "dtype unrecorded",
    }


SCORED_FIELDS = ("data", "corpus", "split", "targets")  # provenance(): what was scored
RUNTIME_FIELDS = ("backend", "dtype")  # provenance(): what computed it


def provenance_tags(
    representatives: list[dict[str, Any]], fields: tuple[str, ...] = SCORED_FIELDS + RUNTIME_FIELDS
) -> list[str]:
    """Per row, the words of provenance() among ``fields`` that tell it from the others (each field that takes
    more than one value among them); "" for every row when they all agree."""
    described = [provenance(row) for row in representatives]
    differing = [field for field in fields if len({d[field] for d in described if d[field] is not None}) > 1]
    return [" ".join(d[field] for field in differing if d[field] is not None) for d in described]


def row_ppl(row: dict[str, Any]) -> float | None:
    """A row's perplexity: inf where it scored a finite loss whose exp overflows a float (stored as null
    beside the loss), None where nothing was scored or the loss is not finite."""
    if row["ppl"] is not None:
        return row["ppl"]
    loss = row.get("loss")
    return perplexity(loss) if isinstance(loss, (int, float)) else None


def row_order(row: dict[str, Any]) -> tuple:
    variation = row.get("variation", "")
    return (
        str(row.get("data")),
        variation != "",
        variation,
        row.get("measure") or "",  # plain perplexity first
        row["protocol"],
        row["length"],
        row["stride"] or 0,
    )


def setting_label(row: dict[str, Any]) -> str:
    """``sliding yarn:8``: what distinguishes a row at a given length. A sliding stride is shown when it is
    not the default L/2, so default-stride rows of all lengths share a label; a streaming row shows its sinks
    (``streaming (k=4)``), a row evaluated with an attention temperature its label (``sliding logn``)."""
    label = row["protocol"]
    if row["stride"] and row["stride"] != effective_stride(row["length"], None):
        label += f" (S={row['stride']})"
    if row.get("sinks") is not None:  # streaming: the window is the length less the sinks
        label += f" (k={row['sinks']})"
    return " ".join(filter(None, (label, key_label(row), condition_label(row))))


def key_label(row: dict[str, Any]) -> str:
    """``key tokens (α=2, β=-2, short 64/16)``: a key-token row's measure and what selected its tokens (the
    thresholds, the short context and its stride, and the evaluator where it is another run); "" for a plain
    perplexity row."""
    if row.get("measure") != KEY_TOKENS:
        return ""
    evaluator, step = row.get("key_evaluator"), row.get("key_evaluator_step")
    by = "" if evaluator in (None, "self") else f", evaluator {Path(evaluator).name} step {step}"
    return (
        f"key tokens (α={row.get('key_lsd_threshold'):g}, β={row.get('key_lcl_threshold'):g}, "
        f"short {row.get('key_short_length')}/{row.get('key_short_stride')}{by})"
    )


def condition_label(row: dict[str, Any]) -> str:
    """What a row was evaluated with besides its protocol and length (``yarn:8 logn``): the variation, the
    attention temperature and a task row's random positions (``randpos:1024``, eval.random_positions); "" for the
    run as trained. Rows of one run that differ in it are other measurements."""
    n_positions = row.get("random_positions")
    positions = f"randpos:{n_positions}" if n_positions else ""
    return " ".join(filter(None, (row.get("variation", ""), temperature_label(row.get("attn_temperature")), positions)))


def format_number(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if abs(value) < 1e4 else f"{value:,.0f}"


def format_ppl(ppl: float | None) -> str:
    return "n/a" if ppl is None else format_number(ppl)


def format_estimate(estimate: Estimate | None, n_expected: int = 1, digits: int = 2) -> str:
    """A results cell: "n/a" for None, the value alone for one seed (or "inf" where a seed diverged), else
    "mean ± half-width of the 95% CI";
    "(n=k)" when fewer values than the row's n_expected seeds went into it."""
    if estimate is None:
        return "n/a"
    value = format_number(estimate.mean, digits)
    if estimate.half_width is not None and math.isfinite(estimate.mean):  # inf: a diverged seed, no interval
        value += f" ± {format_number(estimate.half_width, digits)}"
    return value + (f" (n={estimate.n})" if estimate.n != n_expected else "")


def labelled_rows(rows: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(label, row) per row: its setting (setting_label) and, where the rows scored more than one thing
    (group_by_scored), " [...]" naming what tells its group apart (provenance_tags): "sliding [split all]".
    A row that scored nothing is listed in every group it joins, so each line shows where it is n/a."""
    groups = group_by_scored(rows)
    tags = provenance_tags([members[0] for members in groups.values()])  # scored rows come first
    return [
        (setting_label(row) + (f" [{tag}]" if tag else ""), row)
        for members, tag in zip(groups.values(), tags)
        for row in sorted(members, key=row_order)
    ]
