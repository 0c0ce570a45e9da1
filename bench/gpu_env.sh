# Sourced by the scripts that run on a GPU lease (bench/gpu_lease.sh, bench/gpu_study.sh,
# results/induction-budget-gpu/run.sh): the packages of .gpu_site/ and, as the default corpus, the standard
# library it carries from the machine that made it (`bash bench/gpu_study.sh --prepare` says why).
# describe_machine prints the GPU and the versions; prepare_corpus refuses a corpus whose fingerprint is not the one
# --prepare recorded, then tokenizes it once, before runs start beside each other; pack_finished_runs exports what
# a lease finished.
export PYTHONUNBUFFERED=1
export POSGPT_CACHE_DIR=/tmp/posgpt-cache
[[ -d .gpu_site ]] && export PYTHONPATH=$PWD/.gpu_site
if [[ -f .gpu_site/stdlib.tar.xz ]]; then
    mkdir -p /tmp/lease-stdlib && tar -xJf .gpu_site/stdlib.tar.xz -C /tmp/lease-stdlib
    export POSGPT_LEASE_STDLIB=/tmp/lease-stdlib
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
made_beside = Path(".gpu_site/corpus_fingerprint")
if made_beside.exists() and made_beside.read_text().strip() != fingerprint:
    sys.exit(f"error: this corpus is not the one .gpu_site was made beside ({made_beside.read_text().strip()}): "
             "the runs would train on other tokens; make .gpu_site again with bench/gpu_study.sh --prepare")
print({split: len(tokens) for split, tokens in load_splits(cfg).items()})
EOF
}

# pack_finished_runs ARCHIVE LOGS RUN_DIR...: the runs that finished (their perplexity, or a task run's accuracy,
# is written; one stopped by a time limit has neither, and scripts/export_results.py would refuse the whole list
# for it) exported without checkpoints into /tmp/lease-export, with the *.log files of the folder LOGS, packed into
# ARCHIVE.
pack_finished_runs() {
    local archive=$1 logs=$2 run finished=()
    shift 2
    for run in "$@"; do
        [[ -f "$run/eval/extrapolation.json" || -f "$run/eval/tasks.json" ]] && finished+=("$run")
    done
    echo "finished runs: ${#finished[@]} of $#"
    rm -rf /tmp/lease-export && mkdir -p /tmp/lease-export/logs && cp "$logs"/*.log /tmp/lease-export/logs/
    [[ ${#finished[@]} -gt 0 ]] && python scripts/export_results.py "${finished[@]}" --to /tmp/lease-export
    tar -czf "$archive" -C /tmp lease-export
}
