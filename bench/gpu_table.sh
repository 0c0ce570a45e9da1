#!/usr/bin/env bash
# The GPU table in one command: the CUDA-only tests, train.py and its evaluation end to end on a task, and every
# benchmark of bench/README.md ("GPU: how to measure and commit"), all recorded in ONE results file, with the
# table docs/speed.md takes.
#
#   bash bench/gpu_table.sh OUT_DIR [/path/to/nanoGPT/model.py]
#
# Writes OUT_DIR/<date>-<gpu>.json (commit it under bench/results/), OUT_DIR/table.md (tokens/s, MFU, peak memory
# and the ratio to RoPE in the same command, per scheme and path; scoring at 16K), the machine (env.txt) and each
# step's console output (*.txt). Needs CUDA. Each step has a time limit and records as it goes, so a step that
# fails or hangs loses only itself; the limits add up to 19 minutes (the tests, the passkey runs, every scheme
# eager and the compiled bias schemes took 5 on one H200 on 2026-11-26). The tests' outcome is the file's first
# run (command, pass/fail/skip counts, the pytest summary line); each benchmark then appends its JSON lines.
#
# On a node without internet, make .offline_bundle/ where pip works (bash bench/offline_bundle.sh) and copy it
# along with the checkout: bench/gpu_env.sh puts its packages on the path.
set -uo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 ]] || { echo "usage: bash bench/gpu_table.sh OUT_DIR [/path/to/nanoGPT/model.py]" >&2; exit 2; }
OUT=$(mkdir -p "$1" && cd "$1" && pwd) || exit
nanogpt=${2:-}
source bench/gpu_env.sh
describe_machine 2>&1 | tee "$OUT/env.txt"
gpu=$(python -c "import torch; assert torch.cuda.is_available(), 'no CUDA'; print(torch.cuda.get_device_name().replace(' ', '-'))") || exit
F=$OUT/$(date +%F)-$gpu.json
echo "recording into $F"

# 1. train.py on the GPU (bf16 autocast, compile, fused AdamW: its defaults there), then its own evaluation:
#    passkey with RoPE at its default settings, and FoX (FlexAttention with a cumulative bias) for 500 steps.
#    In the background, beside the CUDA tests: their timings do not matter.
work=$(mktemp -d)  # the passkey runs' directories (checkpoints): their console output goes to OUT_DIR
(
  for spec in "rope 3000 140" "fox 500 90"; do
    read -r pe steps limit <<< "$spec"
    timeout "$limit" python train.py task=passkey pe="$pe" train.max_steps="$steps" hydra.run.dir="$work/passkey-$pe" \
      logging.progress=false logging.wandb.mode=disabled > "$OUT/train_passkey_$pe.txt" 2>&1
    echo "exit $?" >> "$OUT/train_passkey_$pe.txt"
  done
) &
train_pid=$!

# 2. The CUDA-only tests (they skip on CPU: FlexAttention and SDPA against the math path for every scheme, the
#    fused loss, FoX), the compile tests with inductor included.
tests=(tests/test_backends.py tests/test_loss.py tests/test_flex_all_schemes.py tests/test_pe_fox.py tests/test_compile.py)
timeout 200 python -m pytest -q -rs -n 8 -p no:cacheprovider "${tests[@]}" -k "cuda or compile or flex" > "$OUT/tests.txt" 2>&1
status=$?
python - "$F" "$status" "$OUT/tests.txt" "${tests[*]}" <<'PY'
import re, sys
from pathlib import Path
sys.path.insert(0, "scripts")
from bench import save_run
path, status, log, tests = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
lines = log.read_text().strip().splitlines()
summary = lines[-1] if lines else f"no output (exit {status})"
counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|error)", summary)}
save_run(path, "-m pytest", ["-q", "-n", "8", *tests.split(), "-k", "cuda or compile or flex"],
         [{"exit_status": status, "summary": summary, **counts}])
PY
wait "$train_pid"

# 3. The benchmarks, GPT-2 small at 1024 tokens, batch 16: every scheme eager (the bias schemes' FlexAttention
#    kernels are compiled whatever train.compile says); compiled, RoPE and the bias schemes, with scoring at 16K
#    (16x the training length); the fused loss on GPU; the bias schemes through SDPA with a blockwise mask instead
#    of FlexAttention; the memory model's prediction beside the measured peak; nanoGPT at the same size.
bench() {  # bench LIMIT LOG ARGS...: one step, its time limit, its console output
  local limit=$1 log=$OUT/$2.txt
  shift 2
  timeout "$limit" python "$@" > "$log" 2>&1
  echo "exit $?" >> "$log"
}
every=$(python -c "from model.pe import SCHEMES; print(','.join(sorted(SCHEMES)))")
gpt2=(model=gpt2 train.seq_len=1024 train.batch_size=16 --warmup 5 --steps 10 --record "$F")
bench 150 bench_eager scripts/speed.py "${gpt2[@]}" pe="$every" train.compile=false
bench 200 bench_compiled scripts/speed.py "${gpt2[@]}" pe=rope,alibi,t5,kerple,fire,fox train.compile=true --eval-length 16384
bench 120 bench_fused_ce scripts/speed.py "${gpt2[@]}" pe=rope,alibi model.fused_ce=always
bench 150 bench_sdpa scripts/speed.py "${gpt2[@]}" pe=alibi,t5,kerple,fire model.attn_backend=sdpa --eval-length 16384
for pe in rope alibi; do
  bench 90 "estimate_$pe" scripts/estimate.py model=gpt2 train.seq_len=1024 train.batch_size=16 pe=$pe --measure --record "$F"
done
if [[ -n "$nanogpt" ]]; then
  bench 120 bench_nanogpt scripts/speed_nanogpt.py --model-py "$nanogpt" --n-layer 12 --n-head 12 --n-embd 768 \
    --seq-len 1024 --batch-size 16 --warmup 5 --steps 10 --record "$F"
fi

# 4. The table: one row per scheme and command, the ratio against RoPE's row of the same command.
python - "$F" rope > "$OUT/table.md" <<'PY'
import json, sys
path, baseline = sys.argv[1], sys.argv[2]
runs = json.load(open(path))["runs"]


def ratio(value, base):
    return f"{value / base:.2f}x" if value and base else ""


def gb(mib):
    return f"{mib / 1024:.1f}" if mib else ""


print(f"`{path.rsplit('/', 1)[-1]}`\n")
for run in runs:
    if "pytest" in run["command"]:
        print(f"CUDA tests: {run['output'][0]['summary']}\n")
print("| scheme | compile | attention | fused loss | tokens/s | vs RoPE | MFU | peak GiB | 16K tokens/s | vs RoPE | 16K GiB |")
print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
for run in runs:
    rows = [r for r in run["output"] if "tokens_per_s" in r]
    base = next((r for r in rows if r.get("pe") == baseline and "impl" not in r), {})
    for r in rows:
        c, e, base_e = r.get("config", {}), r.get("eval") or {}, base.get("eval") or {}
        cells = [r.get("impl", r.get("pe")), c.get("compile", ""), c.get("attn_backend", ""), c.get("fused_ce", "")]
        cells += [f"{r['tokens_per_s'] / 1e3:.0f}k", ratio(r["tokens_per_s"], base.get("tokens_per_s"))]
        cells += [r.get("mfu") or "", gb(r.get("peak_memory_mb"))]
        if e.get("tokens_per_s"):
            cells += [f"{e['tokens_per_s'] / 1e3:.0f}k", ratio(e["tokens_per_s"], base_e.get("tokens_per_s"))]
            cells += [f"{e['peak_memory_mb'] / 1024:.2f}"]
        else:
            cells += [e.get("error", ""), "", ""]
        print("| " + " | ".join(str(cell) for cell in cells) + " |")
PY
cat "$OUT/table.md"
echo "done: $F and $OUT/table.md (commit the file under bench/results/, the table in docs/speed.md)"
