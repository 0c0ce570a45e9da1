#!/usr/bin/env bash
# The length-extrapolation study: train every positional scheme with identical settings, evaluate each at
# 1-16x its training length (both protocols, at the end of training), evaluate the RoPE run again with
# context extension (YaRN, NTK), and compare them all in one table and one plot.
#
#   scripts/study.sh                                   # -> multirun/study-<date>/
#   scripts/study.sh runs/study                        # into runs/study/
#   scripts/study.sh /tmp/smoke train.max_steps=20 eval.max_tokens=2048    # a quick smoke test
#
# Arguments after the directory are Hydra overrides for train.py; they override the study's settings
# below, and eval.py reuses them (it recomposes each run's config from its training overrides).
# Environment: SCHEMES (default sinusoidal,learned,rope,alibi,none), ROPE_SCALINGS (default [yarn:16,ntk:16]).
#
# Settings: train.py's defaults (the tiny model at context 64, batch 8, lr 1e-3, 1200 steps: long enough for
# the tiny model to use position, which it starts to after ~1000 steps), evaluated on the same 32K validation
# tokens at 64 .. 1024 tokens.
# Output, in the study directory:
#   <n>-<scheme>/                  each training run (checkpoints, metrics.jsonl, eval/ with its own reports)
#   comparison.md, comparison.png  nonoverlapping protocol: perplexity by length, one row/line per setting
#   comparison_sliding.md, comparison_sliding.png                       the same for the sliding protocol
#   comparison_per_position.png    loss by position within 1024-token windows, one line per setting
set -euo pipefail
cd "$(dirname "$0")/.."

study_dir="multirun/study-$(date +%Y-%m-%d_%H-%M-%S)"
if [[ $# -gt 0 && "$1" != *=* ]]; then
    study_dir="$1"
    shift
fi
schemes="${SCHEMES:-sinusoidal,learned,rope,alibi,none}"
rope_scalings="${ROPE_SCALINGS:-[yarn:16,ntk:16]}"

python train.py -m "pe=$schemes" "hydra.sweep.dir=$study_dir" \
    "eval.length_multipliers=[1,2,4,8,16]" \
    "logging.wandb.group=$(basename "$study_dir")" \
    "$@"

shopt -s nullglob
for rope_run in "$study_dir"/*-rope; do
    python eval.py "run_dir=$rope_run" "eval.scalings=$rope_scalings"
done

runs=("$study_dir"/[0-9]*-*/)
python scripts/compare.py "${runs[@]}" --markdown "$study_dir/comparison.md" --plot "$study_dir/comparison.png" \
    --per-position "$study_dir/comparison_per_position.png"
python scripts/compare.py "${runs[@]}" --protocol sliding \
    --markdown "$study_dir/comparison_sliding.md" --plot "$study_dir/comparison_sliding.png"
