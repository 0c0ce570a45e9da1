"""Results documents across format versions: the one place that knows an older version.

Every results document (``eval/<file>.json``, evaluation/store.py) records the version of its format in
``"format"``, an integer; a document without one is version 1. :func:`to_current` upgrades a document read from
disk to :data:`FORMAT`, one version at a time, so every other reader reads the current version only. A file is never
rewritten by reading it: an older document stays as it was written, and is upgraded again each time it is read.

Version 1 (no ``"format"``) differs from version 2 in:

- ``"config"``, the trained config, may be absent: version 2 holds it, null where the document never recorded it
  (reports/runs.py then reads the checkpoint's).
- A perplexity row (extrapolation.json) may hold each evaluation-time setting of its scheme as a field of its own
  (``"scaling"``, null where the scheme had none) instead of ``"variation"`` (its label) and
  ``"variation_settings"``; version 2 rows hold the latter.

Fields a row gained over time without a new version keep a meaning for their absence, read where they are read: a
row without ``"split_digest"``, ``"attn_backend"`` or ``"dtype"`` has its content, backend or dtype unrecorded
(evaluation/results.py), one without ``"attn_temperature"`` or ``"random_positions"`` was evaluated without them,
and a copy-probe row without ``"copy_min_count"`` drew its span from every token (0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core.errors import PosGPTError
from model.pe import SCHEMES
from model.pe.base import PositionalEncoding

FORMAT = 2  # the version every document is written in, and every reader reads
# A version-1 perplexity row's setting fields: the evaluation-time settings every scheme declares.
VERSION_1_SETTING_FIELDS = sorted({name for scheme in SCHEMES.values() for name in scheme.eval_time_settings})
PERPLEXITY_FILE = "extrapolation"  # evaluation/perplexity_format.py's file


def format_of(document: dict[str, Any]) -> int:
    """The format version of a document read from disk (1 where it records none); a PosGPTError for a version this
    posgpt cannot read."""
    version = document.get("format", 1)
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= FORMAT:
        raise PosGPTError(f"format {version!r} is not a results format this posgpt reads (1 to {FORMAT})")
    return version


def to_current(document: dict[str, Any], file: str) -> dict[str, Any]:
    """``document`` (the results file ``file``, e.g. ``extrapolation``) upgraded to :data:`FORMAT`; a new dict, the
    one given left as it is."""
    version = format_of(document)
    while version < FORMAT:
        document = _STEPS[version](document, file)
        version += 1
    return document


def _from_version_1(document: dict[str, Any], file: str) -> dict[str, Any]:
    """Version 1 to 2: the config recorded (null where it was not), a perplexity row's setting fields as its
    variation."""
    upgraded = {"format": 2, **document, "config": document.get("config")}
    upgraded["format"] = 2
    if file == PERPLEXITY_FILE:
        scheme = SCHEMES.get(document.get("pe"), PositionalEncoding)
        upgraded["results"] = [_variation_of_version_1(scheme, row) for row in document["results"]]
    return upgraded


def _variation_of_version_1(scheme: type[PositionalEncoding], row: dict[str, Any]) -> dict[str, Any]:
    """A version-1 perplexity row with its setting fields (VERSION_1_SETTING_FIELDS) turned into its variation, in
    the place the first of them held; a row that already holds a variation as it is."""
    if "variation" in row:
        return row
    settings = {name: row[name] for name in VERSION_1_SETTING_FIELDS if row.get(name) is not None}
    upgraded: dict[str, Any] = {}
    for key, value in row.items():
        if key not in VERSION_1_SETTING_FIELDS:
            upgraded[key] = value
        elif "variation" not in upgraded:
            upgraded.update(variation=scheme.variation_label(settings), variation_settings=settings)
    return upgraded


_STEPS: dict[int, Callable[[dict[str, Any], str], dict[str, Any]]] = {1: _from_version_1}
