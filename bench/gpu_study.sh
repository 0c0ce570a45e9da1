#!/usr/bin/env bash
# A study on one GPU: scripts/study.sh for several schemes (and tasks) at once, one study.sh per (task, scheme)
# running its seeds in turn, all beside each other on the one GPU (tiny models leave it mostly idle: each
# process's Python is the limit), then every finished run exported (scripts/export_results.py, no checkpoints)
# into $OUT/results.tgz (runs/) with the study logs.
#
#   OUT=/some/dir LIMIT=480 bash bench/gpu_study.sh rope,alibi,none 1,2,3 <train.py overrides...>
#   OUT=/some/dir LIMIT=480 bash bench/gpu_study.sh --tasks copy,flipflop rope,alibi 1,2,3 <overrides...>
#
# LIMIT (seconds) stops every study.sh still running (train.py saves its checkpoint on the signal); the runs
# finished by then are exported, the others are left out. Overrides are study.sh's, so a GPU study can repeat a
# CPU study's settings: add train.dtype=float32 train.compile=false model.attn_backend=sdpa to compute as the
# CPU does (float32 matmuls still run as TF32 on CUDA, core/runtime.py).
#
# On a node without internet, make .offline_bundle/ first where pip works (bash bench/offline_bundle.sh) and copy
# it along: its packages, and its standard library as the default corpus, so that a node with another Python
# trains on the same tokens (the corpus fingerprint is checked before any run starts).
set -uo pipefail
cd "$(dirname "$0")/.."

tasks=none
if [[ "${1:-}" == --tasks ]]; then
    tasks=$2
    shift 2
fi
OUT=${OUT:-/tmp/gpu_study}
LIMIT=${LIMIT:-480}
schemes=$1
seeds=$2
shift 2
mkdir -p "$OUT"
source bench/gpu_env.sh
study=/tmp/gpu-study
mkdir -p "$study/logs"
describe_machine 2>&1 | tee "$OUT/env.txt"
if [[ "$tasks" == none ]]; then  # tasks need no corpus
    prepare_corpus 2>&1 | tee -a "$OUT/env.txt" || exit
fi

pids=()
IFS=, read -ra scheme_list <<< "$schemes"
IFS=, read -ra task_list <<< "$tasks"
for task in "${task_list[@]}"; do
    task_option=()
    [[ "$task" != none ]] && task_option=(--tasks "$task")
    for scheme in "${scheme_list[@]}"; do
        OMP_NUM_THREADS=1 timeout "$LIMIT" scripts/study.sh "${task_option[@]}" --schemes "$scheme" \
            --seed-list "$seeds" "$study/$task-$scheme" train.num_threads=1 logging.progress=false \
            logging.wandb.mode=disabled "$@" > "$study/logs/$task-$scheme.log" 2>&1 &
        pids+=($!)
    done
done
for pid in "${pids[@]}"; do wait "$pid"; done

pack_finished_runs "$OUT/results.tgz" "$study/logs" "$study"/*/*-s*/ | tee -a "$OUT/env.txt"
tail -n 3 "$study"/logs/*.log
