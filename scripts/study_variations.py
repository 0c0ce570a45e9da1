"""The evaluation-time variations (``eval.variations`` entries, model/pe/base.py's parse_variation) scripts/study.sh
evaluates every run of a scheme with, besides the run as trained: a study's choice, not the scheme's, so it lives
beside the study. A scheme without an entry is evaluated as trained only.

``python scripts/study_variations.py SCHEME...`` prints "<scheme> <list>" a line per scheme (the list "" when it has
none), and exits 2 naming the schemes of configs/pe/ when one is unknown.
"""

from __future__ import annotations

import _repo  # noqa: F401  (the repository's packages on sys.path)

import sys

# No-fine-tuning extensions to the study's longest length, 16x. The remaps' windows are in tokens, chosen for the
# study's L = 64: ReRoPE's 32 < L, and Self-Extend's group 32 maps 16L's farthest distance (W + (16L - W)/G = 63)
# inside L.
ROPE = ("yarn:16", "ntk:16", "self_extend:32:32", "rerope:32", "string:32:4")
# RoPE's rescalings for the RoPE layers of a per-layer pattern (not its remaps: each doubles a study's task
# evaluation, and RoPE's own runs measure them).
PATTERN = ("yarn:16", "ntk:16")

STUDY_VARIATIONS: dict[str, tuple[str, ...]] = {
    "rope": ROPE,
    "p_rope": ROPE,
    "hybrid": PATTERN,
    "rnope": PATTERN,
    "llama4_inope": PATTERN,
}


def main(names: list[str]) -> int:
    from model.pe import SCHEMES

    unknown = [name for name in names if name not in SCHEMES]
    if unknown:
        known = ",".join(sorted(SCHEMES))
        print(f"error: --schemes takes schemes of configs/pe/ ({known}), got {','.join(unknown)}", file=sys.stderr)
        return 2
    for name in names:
        variations = STUDY_VARIATIONS.get(name, ())
        print(name, f"[{','.join(variations)}]" if variations else "")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
