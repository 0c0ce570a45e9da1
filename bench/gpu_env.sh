# Sourced by the scripts that run on a GPU lease (bench/gpu_lease.sh, bench/gpu_study.sh,
# results/induction-budget-gpu/run.sh): the packages of .gpu_site/ and, as the default corpus, the standard
# library it carries from the machine that made it (`bash bench/gpu_study.sh --prepare` says why).
# describe_machine prints the GPU and the versions; prepare_corpus tokenizes that corpus once, before runs start
# beside each other, and prints its fingerprint, which must equal the one --prepare printed.
export PYTHONUNBUFFERED=1
export POSGPT_CACHE_DIR=/tmp/posgpt-cache
[[ -d .gpu_site ]] && export PYTHONPATH=$PWD/.gpu_site
if [[ -f .gpu_site/stdlib.tar.xz ]]; then
    mkdir -p /tmp/lease-stdlib && tar -xJf .gpu_site/stdlib.tar.xz -C /tmp/lease-stdlib
    export POSGPT_LEASE_STDLIB=/tmp/lease-stdlib
fi

describe_machine() {
    nvidia-smi -L 2>/dev/null
    python -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)"
}

prepare_corpus() {
    python -c "from data.config import DataConfig; from data.sources import open_corpus; from data.cache import load_splits
cfg = DataConfig(name='python_stdlib', source='python_stdlib')
print('corpus fingerprint', open_corpus(cfg).fingerprint); print({k: len(v) for k, v in load_splits(cfg).items()})"
}
