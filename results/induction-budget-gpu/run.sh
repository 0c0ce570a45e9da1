#!/usr/bin/env bash
# At what budget does the default model form an induction head? The default run (model=tiny_wide, RoPE, context
# 64, seed 1) with 32x its batch (256 sequences, 16,384 tokens a step), trained for each budget in STEPS on its own
# cosine schedule, beside each other on one GPU, then scored with the copy probe (its README has the settings).
#
#   OUT=/some/dir bash results/induction-budget-gpu/run.sh           # on one GPU (offline: bench/README.md)
#   STEPS="5 10" OUT=/tmp/x bash results/induction-budget-gpu/run.sh train.batch_size=4 train.device=cpu   # a check
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu_env.sh
OUT=${OUT:-/tmp/induction-budget}
STEPS=${STEPS:-500 1500 4500}
LIMIT=${LIMIT:-200}
runs=/tmp/induction-budget
mkdir -p "$OUT" "$runs/logs"
describe_machine 2>&1 | tee "$OUT/env.txt"
prepare_corpus 2>&1 | tee -a "$OUT/env.txt" || exit
for steps in $STEPS; do
    timeout "$LIMIT" python train.py pe=rope train.seed=1 train.batch_size=256 train.max_steps="$steps" \
        train.compile=false train.val_every=500 train.checkpoint_every=100000 "eval.tasks=[copy_probe]" \
        eval.copy_min_count=1000 "eval.protocols=[nonoverlapping]" "eval.length_multipliers=[1,4]" \
        logging.progress=false logging.wandb.mode=disabled hydra.run.dir="$runs/steps_$steps" "$@" \
        > "$runs/logs/steps_$steps.log" 2>&1 &
done
wait
pack_finished_runs "$OUT/results.tgz" "$runs/logs" "$runs"/steps_*/
grep -h -A3 "copy_probe" "$runs"/logs/*.log | tail -n 30
