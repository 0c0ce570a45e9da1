"""The evaluation-time variations (``eval.variations`` entries, model/pe/base.py's parse_variation) scripts/study.sh
evaluates every run of a scheme with, besides the run as trained: a study's choice, not the scheme's, so it lives
beside the study. A scheme without an entry is evaluated as trained only.
scripts/study_check.py reads it, as it plans a study.
"""

from __future__ import annotations

import _repo  # noqa: F401  (the repository's packages on sys.path)

import json
from pathlib import Path

# A table, not code (scheme names appear only in model/pe/ and in data: tests/house/test_house_rules.py).
# RoPE and p-RoPE: no-fine-tuning extensions to the study's longest length, 16x; the remaps' windows are in tokens,
# chosen for the study's L = 64: ReRoPE's 32 < L, and Self-Extend's group 32 maps 16L's farthest distance
# (W + (16L - W)/G = 63) inside L. Per-layer patterns: RoPE's rescalings for their RoPE layers (not its remaps: each
# doubles a study's task evaluation, and RoPE's own runs measure them).
STUDY_VARIATIONS: dict[str, list[str]] = json.loads(Path(__file__).with_name("study_variations.json").read_text())
