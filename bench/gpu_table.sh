#!/usr/bin/env bash
# The GPU table: the CUDA-only tests, train.py and its evaluation end to end on a task, and every benchmark of
# bench/README.md ("GPU: how to measure and commit"), recorded in ONE results file per GPU, with the table
# docs/speed.md takes. In five parts whose steps' time limits add up to 8 minutes at most each, so that a part fits
# a 10-minute job (one compiled scheme with its 16K scoring takes about 90 s on an H200, most of it compiling);
# without --part, the five in turn:
#
#   bash bench/gpu_table.sh OUT_DIR [--part 1|2|3|4|5[,...]] [--budget SECONDS] [/path/to/nanoGPT/model.py]
#
#   part 1: correctness first: the CUDA-only tests (the fused kernels of stick-breaking and PaTH among them) beside
#           train.py on passkey (RoPE, FoX); then T5 and KERPLE compiled beside compiled RoPE (GPT-2 small, 1,024
#           tokens, batch 16): training tokens/s and peak memory, and scoring 16K tokens (FlexAttention).
#   part 2: the other bias schemes the same way; a scheme whose bias depends on the distance alone and that did not
#           run FlexAttention is measured again under two other kernel options.
#   part 3: stick-breaking and PaTH compiled on flash-linear-attention's kernels beside RoPE, training and scoring
#           16K tokens; CoPE compiled (its written-out attention in blocks of queries recomputed in the backward
#           pass).
#   part 4: RoPE's MFU: nanoGPT at the same size, the fused loss on GPU, a compile mode that autotunes, batch 32,
#           cuDNN's attention.
#   part 5: every scheme eager, RoPE and the schemes without a PyTorch kernel first; the memory model's prediction
#           beside the measured peak (RoPE, CoPE); the bias schemes through SDPA's blockwise masks instead of
#           FlexAttention.
#
# --budget: the seconds all the chosen parts may take together (a job with a wall-clock limit): each step's time
# limit is cut to what is left, and a step that would get under 30 s is skipped (said in its log).
#
# Every part appends to OUT_DIR/<date>-<gpu>.json (the date of the first part run into OUT_DIR on that GPU: commit it
# under bench/results/) and writes OUT_DIR/table.md from all it holds (tokens/s, MFU, peak memory and the ratios to
# RoPE, per scheme and command: RoPE of the same command, or the last recorded RoPE of the same compile setting; it
# goes in docs/speed.md); the machine (env.txt) and each step's console output (*.txt). Needs CUDA. A step records as
# it goes and is stopped at its time limit with SIGINT, which keeps the schemes it measured; a scheme that fails is
# recorded with its error and the next one runs.
#
# On a node without internet, make .offline_bundle/ where pip works (bash bench/offline_bundle.sh) and copy it
# along with the checkout: bench/gpu_env.sh puts its packages on the path.
set -uo pipefail
cd "$(dirname "$0")/.."
usage="usage: bash bench/gpu_table.sh OUT_DIR [--part 1|2|3|4|5[,...]] [--budget SECONDS] [/path/to/nanoGPT/model.py]"
[[ $# -ge 1 ]] || { echo "$usage" >&2; exit 2; }
OUT=$(mkdir -p "$1" && cd "$1" && pwd) || exit
shift
parts="1 2 3 4 5"
nanogpt=""
deadline=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --part) [[ ${2:-} =~ ^[1-5](,[1-5])*$ ]] || { echo "$usage" >&2; exit 2; }; parts=${2//,/ }; shift 2 ;;
    --budget) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "$usage" >&2; exit 2; }; deadline=$((SECONDS + $2)); shift 2 ;;
    -*) echo "$usage" >&2; exit 2 ;;
    *) nanogpt=$1; shift ;;
  esac
done
source bench/gpu_env.sh
describe_machine 2>&1 | tee -a "$OUT/env.txt"
gpu=$(python -c "import torch; assert torch.cuda.is_available(), 'no CUDA'; print(torch.cuda.get_device_name().replace(' ', '-'))") || exit
F=$(ls -t "$OUT"/*-"$gpu".json 2>/dev/null | head -n 1)
[[ -n $F ]] || F=$OUT/$(date +%F)-$gpu.json
echo "recording into $F"

gpt2=(model=gpt2 train.seq_len=1024 train.batch_size=16 --warmup 5 --steps 10 --record "$F")
# Part 1's bias schemes: the two whose FlexAttention kernels asked for more shared memory than an H200 has on
# 2026-11-27 (part 2 takes the rest).
PART1_BIAS=t5,kerple
registry() {  # registry EXPRESSION: the registered schemes whose class satisfies it (c), comma-separated; mods(c):
  # what the scheme hands attention (model/pe/capabilities.py, ModifiesAttention)
  python -c "from model.pe import SCHEMES; from model.pe.capabilities import *; from model.kernels import WRITTEN_OUT_MODS
mods = lambda c: set(getattr(c, 'modifies', ()))
print(','.join(sorted(n for n, c in SCHEMES.items() if $1)))"
}
limit_for() {  # limit_for LIMIT: LIMIT, or less where --budget leaves less; 0 when under 30 s would be left
  local limit=$1 left
  if [[ -n $deadline ]]; then
    left=$((deadline - SECONDS - 5))
    ((left < limit)) && limit=$left
    ((limit < 30)) && limit=0
  fi
  echo "$limit"
}
bench() {  # bench LIMIT LOG ARGS...: one step, its time limit (SIGINT, then SIGKILL 15 s later), its console output
  local limit log=$OUT/$2.txt
  limit=$(limit_for "$1")
  shift 2
  echo "$(date +%T) $(basename "$log" .txt) (limit ${limit} s)"
  if ((limit == 0)); then
    echo "skipped: the --budget is spent" > "$log"
    return
  fi
  timeout -s INT -k 15 "$limit" python "$@" > "$log" 2>&1
  echo "exit $?" >> "$log"
}

part1() {
  # Correctness first: the CUDA-only tests (they skip on CPU: FlexAttention and SDPA against the math path for every
  # scheme, forward and backward, fp32 and bf16, the fused loss, FoX, the fused kernels of stick-breaking and PaTH;
  # the compile tests with inductor included), beside train.py on the GPU (bf16 autocast, compile, fused AdamW: its
  # defaults there) and its own evaluation: passkey with RoPE at its default settings, and FoX (FlexAttention with a
  # cumulative bias) for 500 steps. The tests are handed out one at a time (--dist worksteal): a fused kernel's
  # first call autotunes, 40-50 s a test on an H200, and the default hand-out queued all of those on one worker.
  # Then compiled RoPE beside the bias schemes of PART1_BIAS (training, and scoring 16K tokens).
  local work train_pid status tests limit
  work=$(mktemp -d)  # the passkey runs' directories (checkpoints): their console output goes to OUT_DIR
  limit=$(limit_for 180)
  (
    for spec in "rope 3000 100" "fox 500 80"; do
      read -r pe steps run_limit <<< "$spec"
      run_limit=$(limit_for "$run_limit")
      ((run_limit == 0)) && break
      timeout "$run_limit" python train.py task=passkey pe="$pe" train.max_steps="$steps" \
        hydra.run.dir="$work/passkey-$pe" logging.progress=false logging.wandb.mode=disabled \
        > "$OUT/train_passkey_$pe.txt" 2>&1
      echo "exit $?" >> "$OUT/train_passkey_$pe.txt"
    done
  ) &
  train_pid=$!
  tests=(tests/model/test_kernels_backends.py tests/model/test_loss.py tests/model/test_kernels_flex_all_schemes.py tests/model/pe/test_fox.py tests/training/test_step.py
    tests/model/test_kernels_fused_attention.py)
  echo "$(date +%T) tests (limit ${limit} s)"
  ((limit > 0)) && timeout "$limit" python -m pytest -q -rs -n 12 --dist worksteal -p no:cacheprovider "${tests[@]}" \
    -k "cuda or compile or flex" > "$OUT/tests.txt" 2>&1
  status=$?
  python - "$F" "$status" "$OUT/tests.txt" "${tests[*]}" <<'PY'
import re, sys
from pathlib import Path
sys.path.insert(0, "scripts")
from speed import save_run
path, status, log, tests = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
lines = log.read_text().strip().splitlines()
summary = lines[-1] if lines else f"no output (exit {status})"
counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|error)", summary)}
if not counts:  # stopped before pytest's summary: count its progress characters (-q: one per test that ended)
    marks = "".join(line.split(" [")[0] for line in lines if re.fullmatch(r"[.FEsxX]+( +\[ *\d+%\])?", line))
    counts = {"passed": marks.count("."), "failed": marks.count("F"), "error": marks.count("E"),
              "skipped": marks.count("s")}
    summary = f"stopped (exit {status}) before its end: " + ", ".join(f"{n} {w}" for w, n in counts.items())
save_run(path, "-m pytest", ["-q", "-n", "12", *tests.split(), "-k", "cuda or compile or flex"],
         [{"exit_status": status, "summary": summary, **counts}])
PY
  wait "$train_pid"
  bench 230 bench_compiled scripts/speed.py "${gpt2[@]}" pe="rope,$PART1_BIAS" train.compile=true --eval-length 16384
}

part2() {
  # Compiled RoPE beside the other bias schemes (a score bias or a cumulative one), training and scoring 16K; then a
  # scheme whose bias depends on the distance alone and whose latest record did not run FlexAttention is measured
  # again with less shared memory per kernel (its kernels asked for 245,760 bytes of an H200's 232,448 on
  # 2026-11-27, forward included): 2 pipeline stages instead of 3 in both passes, then the forward's tiles halved.
  local rest retry
  rest=$(registry "(issubclass(c, ScoreBias) or 'pair_term' in mods(c)) and n not in '$PART1_BIAS'.split(',')")
  bench 320 bench_compiled_bias scripts/speed.py "${gpt2[@]}" pe="rope,$rest" train.compile=true --eval-length 16384
  retry=$(python - "$F" "$(registry "issubclass(c, DistanceBias)")" <<'PY'
import json, sys
latest = {}  # scheme -> its latest record, over every run in the file
for run in json.load(open(sys.argv[1]))["runs"]:
    for row in run["output"]:
        if "pe" in row and "impl" not in row:
            latest[row["pe"]] = row
wanted = sys.argv[2].split(",")
print(",".join(n for n in wanted if n in latest and (latest[n].get("config") or {}).get("attn_backend") != "flex"))
PY
  )
  [[ -z $retry ]] && return
  bench 80 bench_kernel_stages scripts/speed.py "${gpt2[@]}" pe="$retry" train.compile=true \
    "+model.flex_kernel_options={fwd_num_stages:2,bwd_num_stages:2}"
  bench 80 bench_kernel_tiles scripts/speed.py "${gpt2[@]}" pe="$retry" train.compile=true \
    "+model.flex_kernel_options={fwd_BLOCK_M:64,fwd_BLOCK_N:64,bwd_num_stages:2}"
}

part3() {
  # The schemes with a kernel of their own (flash-linear-attention's: stick-breaking, PaTH; recorded as
  # attn_backend=fla where it ran) compiled beside RoPE, training and scoring 16K tokens (each kernel autotunes at
  # its first call: stick-breaking outlasted a 99 s step on 2026-11-27); CoPE compiled (its written-out attention in
  # blocks of queries recomputed in the backward pass; its eager run is part 5's, beside RoPE's).
  bench 300 bench_fused_compiled scripts/speed.py "${gpt2[@]}" pe="rope,$(registry "issubclass(c, FusedKernel)")" \
    train.compile=true --eval-length 16384
  bench 150 bench_cope_compiled scripts/speed.py "${gpt2[@]}" pe="$(registry "'score_mod' in mods(c)")" train.compile=true
}

part4() {
  # RoPE's MFU against nanoGPT's at the same size, and what each of the fast GPT-2 codebases' ideas is worth here: the
  # fused chunked cross-entropy (model.fused_ce=auto is CPU only until measured), a compile mode that autotunes its
  # kernels, a micro-batch twice as large, cuDNN's attention kernel instead of SDPA's own choice.
  if [[ -n "$nanogpt" ]]; then
    bench 100 bench_nanogpt scripts/speed_nanogpt.py --model-py "$nanogpt" --n-layer 12 --n-head 12 --n-embd 768 \
      --seq-len 1024 --batch-size 16 --warmup 5 --steps 10 --record "$F"
  fi
  bench 90 bench_fused_ce scripts/speed.py "${gpt2[@]}" pe=rope,alibi model.fused_ce=always
  bench 110 bench_compile_mode scripts/speed.py "${gpt2[@]}" pe=rope train.compile=true \
    --compile-mode max-autotune-no-cudagraphs
  bench 90 bench_batch32 scripts/speed.py "${gpt2[@]}" pe=rope train.compile=true train.batch_size=32
  bench 90 bench_cudnn scripts/speed.py "${gpt2[@]}" pe=rope train.compile=true --sdpa-backend cudnn
}

part5() {
  # Every scheme eager (the bias schemes' FlexAttention kernels are compiled whatever train.compile says): RoPE
  # first, as the baseline of the command, then the schemes without a PyTorch kernel (the written-out path, or their
  # own), then the rest; the memory model's prediction beside the measured peak (RoPE, CoPE); the bias schemes
  # through SDPA with a blockwise mask instead of FlexAttention, scoring 16K too.
  local pe own written
  written=$(registry "mods(c) & WRITTEN_OUT_MODS")
  own=$(registry "n != 'rope' and not mods(c) & WRITTEN_OUT_MODS")
  bench 150 bench_eager scripts/speed.py "${gpt2[@]}" pe="rope,$written,$own" train.compile=false
  for pe in rope "$(registry "'score_mod' in mods(c)")"; do
    bench 60 "estimate_$pe" scripts/estimate.py model=gpt2 train.seq_len=1024 train.batch_size=16 pe="$pe" --measure \
      --record "$F"
  done
  bench 150 bench_sdpa scripts/speed.py "${gpt2[@]}" pe="$(registry "issubclass(c, ScoreBias)")" model.attn_backend=sdpa \
    --eval-length 16384
}

# The table: one row per scheme and command, its ratios against RoPE's row of the same command, or, in a command
# without RoPE, against the last RoPE row recorded before it with the same compile setting.
write_table() {
  python - "$F" rope > "$OUT/table.md" <<'PY'
import json, sys
path, baseline = sys.argv[1], sys.argv[2]
runs = json.load(open(path))["runs"]


def ratio(value, base):
    return f"{value / base:.2f}x" if value and base else ""


def gb(mib):
    return f"{mib / 1024:.1f}" if mib else ""


def attention(config):
    options = config.get("flex_kernel_options") or {}
    sdpa = config.get("sdpa_backend", "auto")
    return config.get("attn_backend", "") + ("" if sdpa == "auto" else f" {sdpa}") + "".join(
        f" {k}={v}" for k, v in options.items()
    )


print(f"`{path.rsplit('/', 1)[-1]}`\n")
for run in runs:
    if "pytest" in run["command"]:
        print(f"CUDA tests: {run['output'][0]['summary']}\n")
print("| scheme | compile | attention | fused loss | tokens/s | vs RoPE | MFU | peak GiB | vs RoPE "
      "| 16K tokens/s | vs RoPE | 16K GiB | vs RoPE |")
print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
latest = {}  # compile setting -> the last RoPE row recorded so far
for run in runs:
    rows = [r for r in run["output"] if "tokens_per_s" in r or set(r) == {"pe", "error"}]
    ours = [r for r in rows if r.get("pe") == baseline and "impl" not in r and "tokens_per_s" in r]
    for r in rows:
        if "tokens_per_s" not in r:
            print(f"| {r['pe']} | | error: {r['error']} |" + " |" * 10)
            continue
        c, e = r.get("config", {}), r.get("eval") or {}
        base = ours[0] if ours else latest.get(c.get("compile"), {})
        base_e = base.get("eval") or {}
        mode = c.get("compile_mode") or "default"
        compiled = f"{c.get('compile', '')}" + ("" if mode == "default" else f" {mode}")
        cells = [r.get("impl", r.get("pe")), compiled, attention(c), c.get("fused_ce", "")]
        cells += [f"{r['tokens_per_s'] / 1e3:.0f}k", ratio(r["tokens_per_s"], base.get("tokens_per_s"))]
        cells += [r.get("mfu") or "", gb(r.get("peak_memory_mb")), ratio(r.get("peak_memory_mb"), base.get("peak_memory_mb"))]
        if e.get("tokens_per_s"):
            cells += [f"{e['tokens_per_s'] / 1e3:.0f}k", ratio(e["tokens_per_s"], base_e.get("tokens_per_s"))]
            cells += [f"{e['peak_memory_mb'] / 1024:.2f}", ratio(e["peak_memory_mb"], base_e.get("peak_memory_mb"))]
        else:
            cells += [e.get("error", ""), "", "", ""]
        print("| " + " | ".join(str(cell) for cell in cells) + " |")
    for r in ours:
        latest[r.get("config", {}).get("compile")] = r
PY
}

for part in $parts; do
  echo "part $part"
  "part$part"
  write_table
done
cat "$OUT/table.md"
echo "done: $F and $OUT/table.md (commit the file under bench/results/, the table in docs/speed.md)"
