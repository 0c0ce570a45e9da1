# Sourced by the scripts that run on a GPU node (bench/gpu_table.sh, bench/gpu_study.sh,
# results/induction-budget-gpu/run.sh). Where .offline_bundle/ exists (bench/offline_bundle.sh, for a node without
# internet), it puts its packages on the path and reads the default corpus from the standard library it packed.
# describe_machine prints the GPU and the versions; prepare_corpus refuses a corpus whose fingerprint is not the one
# the bundle recorded, then tokenizes it once, before runs start beside each other; pack_finished_runs exports the
# runs that finished.
export PYTHONUNBUFFERED=1
export POSGPT_CACHE_DIR=${POSGPT_CACHE_DIR:-/tmp/posgpt-cache}
[[ -d .offline_bundle ]] && export PYTHONPATH=$PWD/.offline_bundle${PYTHONPATH:+:$PYTHONPATH}
if [[ -f .offline_bundle/stdlib.tar.xz ]]; then
    mkdir -p /tmp/posgpt-stdlib && tar -xJf .offline_bundle/stdlib.tar.xz -C /tmp/posgpt-stdlib
    export POSGPT_STDLIB_CORPUS=/tmp/posgpt-stdlib
fi

describe_machine() {
    nvidia-smi -L 2>/dev/null
    python -c "import importlib.util, sys, torch
triton = importlib.util.find_spec('triton') and __import__('triton').__version__
print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton or 'absent')"
}

prepare_corpus() {
    python - <<'EOF'
import sys
from pathlib import Path

from data.cache import load_splits
from data.config import DataConfig
from data.sources import open_corpus

cfg = DataConfig(name="python_stdlib", source="python_stdlib")
fingerprint = open_corpus(cfg).fingerprint
print("corpus fingerprint", fingerprint)
packed = Path(".offline_bundle/corpus_fingerprint")
if packed.exists() and packed.read_text().strip() != fingerprint:
    sys.exit(f"error: this corpus is not the one .offline_bundle packed ({packed.read_text().strip()}): "
             "the runs would train on other tokens; make the bundle again with bash bench/offline_bundle.sh")
print({split: len(tokens) for split, tokens in load_splits(cfg).items()})
EOF
}

# pack_finished_runs ARCHIVE LOGS RUN_DIR...: the runs that finished (their perplexity, or a task run's accuracy,
# is written; one stopped by a time limit has neither, and scripts/export_results.py would refuse the whole list
# for it) exported without checkpoints into runs/ of ARCHIVE, with the *.log files of the folder LOGS in runs/logs/.
pack_finished_runs() {
    local archive=$1 logs=$2 run finished=() staging
    shift 2
    for run in "$@"; do
        [[ -f "$run/eval/extrapolation.json" || -f "$run/eval/tasks.json" ]] && finished+=("$run")
    done
    echo "finished runs: ${#finished[@]} of $#"
    staging=$(mktemp -d)
    mkdir -p "$staging/runs/logs" && cp "$logs"/*.log "$staging/runs/logs/"
    [[ ${#finished[@]} -gt 0 ]] && python scripts/export_results.py "${finished[@]}" --to "$staging/runs"
    tar -czf "$archive" -C "$staging" runs
    rm -rf "$staging"
}
