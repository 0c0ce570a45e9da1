#!/usr/bin/env bash
# The GPU table in one command, the day a GPU is lent: the CUDA-only tests, then every benchmark of
# bench/README.md ("GPU: how to measure and commit"), all recorded in ONE results file.
#
#   bash bench/gpu_table.sh [path/to/nanoGPT/model.py]      # writes bench/results/<date>-<gpu>.json
#
# Needs CUDA. Takes about half an hour on one H100. The tests' outcome is the file's first run (command,
# pass/fail/skip counts, the pytest summary line); each benchmark then appends its JSON lines.
set -euo pipefail
cd "$(dirname "$0")/.."
gpu=$(python -c "import torch; assert torch.cuda.is_available(), 'no CUDA'; print(torch.cuda.get_device_name().replace(' ', '-'))")
F=${RESULTS:-bench/results/$(date +%F)-$gpu.json}
echo "recording into $F"

# 1. The CUDA-only tests (they skip on CPU), the compile tests with inductor included.
tests=(tests/test_backends.py tests/test_loss.py tests/test_flex_all_schemes.py tests/test_pe_fox.py tests/test_compile.py)
set +e
python -m pytest -q -rs "${tests[@]}" -k "cuda or compile or flex" 2>&1 | tee /tmp/gpu_table_tests.txt
status=${PIPESTATUS[0]}
set -e
python - "$F" "$status" "${tests[*]}" <<'PY'
import re, sys
from pathlib import Path
sys.path.insert(0, "scripts")
from bench import save_run
path, status, tests = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
summary = Path("/tmp/gpu_table_tests.txt").read_text().strip().splitlines()[-1]
counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|error)", summary)}
save_run(path, "-m pytest", ["-q", *tests.split()], [{"exit_status": status, "summary": summary, **counts}])
PY

# 2. The benchmarks: GPT-2 small at 1024 tokens, every scheme; scoring at 16K; the fused loss on GPU;
#    ALiBi through FlexAttention (auto) vs SDPA with a blockwise mask.
every=$(python -c "from model.pe import SCHEMES; print(','.join(sorted(SCHEMES)))")
gpt2=(model=gpt2 train.seq_len=1024 train.batch_size=16 --warmup 10 --steps 30 --record "$F")
python scripts/bench.py "${gpt2[@]}" pe="$every"
python scripts/bench.py "${gpt2[@]}" pe="$every" --eval-length 16384
python scripts/bench.py "${gpt2[@]}" pe=rope,alibi model.fused_ce=always
python scripts/bench.py "${gpt2[@]}" pe=alibi,t5,kerple,fire model.attn_backend=sdpa --eval-length 16384
# The memory model's predictions for the same configs, next to the measurement (one process each).
for pe in rope alibi; do
  python scripts/estimate.py model=gpt2 train.seq_len=1024 train.batch_size=16 pe=$pe --measure --record "$F"
done
if [ $# -ge 1 ]; then
  python scripts/bench_nanogpt.py --model-py "$1" --n-layer 12 --n-head 12 --n-embd 768 --seq-len 1024 \
    --batch-size 16 --warmup 10 --steps 30 --record "$F"
fi
echo "done: $F (commit it, and add the table to bench/README.md)"
