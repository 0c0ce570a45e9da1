"""Training throughput of posgpt, one JSON line per positional scheme (and optionally long-context evaluation).

    python scripts/speed.py pe=learned model.n_layer=4 model.n_head=4 model.n_embd=256 train.seq_len=256 \
        train.batch_size=8
    python scripts/speed.py model=gpt2 train.seq_len=1024 train.batch_size=16 pe=rope,learned,sinusoidal,none,alibi
    python scripts/speed.py model=gpt2 train.seq_len=1024 train.batch_size=16 pe=rope,alibi --eval-length 16384

Takes the same Hydra overrides as train.py; ``pe=a,b,c`` benchmarks each scheme in turn. Each is timed with the
real training pieces (core.runtime.set_up_runtime, experiment.build.build_model, training.optim,
training.step.TrainStep with its autocast, torch.compile where train.compile asks for it) on random tokens, so
no data is read. The fused cross-entropy is the config key ``model.fused_ce=auto|always|never``. Warm-up steps
(compilation, allocator) are not timed; the measured steps are timed as one window with a device sync only at its ends,
as the training loop runs them. Printed per scheme:

    {"pe", "device", "tokens_per_s", "mfu", "peak_memory_mb", "memory_metric", "step_ms", "cpu_share",
     "config": {...}, "eval": {...}}

or {"pe", "error"} for a scheme whose step raised (a kernel that does not compile, memory that runs out): the next
scheme runs, and the command then exits 1 with one line naming the failed schemes. Interrupted (SIGINT: Ctrl-C,
``timeout -s INT``), the schemes measured so far are still recorded.

Peak memory is evaluation/memory.py's PeakMemory, as in the evaluation's result rows: the most memory in use
during the measured block (from before the model is built; for evaluation, with the trained weights in
place), in MiB; "memory_metric" says what was read. MFU uses experiment.build.model_flops_per_token (the count
the training loop logs) and core.runtime's peak table; it is null on CPU and unknown GPUs.
``--record FILE`` appends the run to a results file (bench/README.md). ``--compile-mode`` and ``--sdpa-backend``
(SDPA limited to one of its CUDA kernels: flash, cuDNN's, memory-efficient) try what the fast GPT-2 codebases use.
"""

from __future__ import annotations

import _repo

import argparse
import contextlib
import datetime
import functools
import json
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from core.cli import ArgumentParser, count, exit_on_user_error
from core.config_keys import overridden_keys
from core.errors import PosGPTError, first_line
from core.files import atomic_write, check_outputs, read_user_text
from core.host_memory import reused_freed_memory
from core.runtime import autocast, compile_enabled, peak_flops, select_device, set_up_runtime
from evaluation.memory import PeakMemory
from experiment.build import build_model, model_flops_per_token
from experiment.compose import compose_config
from experiment.config import validate
from experiment.plan import optimizer_settings
from model.loss import use_fused
from training.optim import build_optimizer, build_scheduler
from training.step import TrainStep

# --compile-mode: torch.compile's modes
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def torch_compile_mode(name: str) -> str | None:
    """torch.compile's ``mode`` for a --compile-mode (None: its default)."""
    return None if name == "default" else name


# --sdpa-backend: SDPA's CUDA kernels by torch.nn.attention.SDPBackend's names ("auto": PyTorch's own choice)
SDPA_BACKENDS = {
    "auto": None,
    "flash": "FLASH_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
}


def sdpa_backend(name: str) -> contextlib.AbstractContextManager:
    """SDPA limited to one kernel while a scheme is timed, its compilation included (the kernel is chosen where the
    graph is traced). A kernel that cannot take a call raises: the scheme's record is then its error, never a
    silent fallback to another kernel."""
    if SDPA_BACKENDS[name] is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[name]))


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """The options shared with scripts/speed_nanogpt.py, so both time and record the same way."""
    parser.add_argument("--warmup", type=count(0), default=3, help="untimed steps first (compilation, allocator)")
    parser.add_argument("--steps", type=count(1), default=10, help="timed training steps")
    parser.add_argument(
        "--record",
        type=Path,
        default=None,
        help="also append this run (command line, date, JSON lines) to a results file, "
        "e.g. bench/results/<date>-<device>.json",
    )


def print_record(record: dict) -> None:
    print(json.dumps(record), flush=True)


def read_results_file(path: Path | None) -> dict:
    """The results file ``--record`` appends to (``{"runs": [...]}``, empty when new), or a PosGPTError if it is
    not one or lies in a training run: called before anything is timed, and again to append."""
    check_outputs({"--record": path})
    if path is None or not path.exists():
        return {"runs": []}
    try:
        results = json.loads(read_user_text(path, "--record"))
    except ValueError as error:
        results = error
    if not isinstance(results, dict) or not isinstance(results.get("runs"), list):
        raise PosGPTError(
            f"--record {path} is not a results file of scripts/speed.py (a JSON object with a 'runs' list): "
            "give a new file or one it wrote"
        )
    return results


def save_run(path: Path, script: str, argv: list[str], records: list[dict], replace: int | None = None) -> int:
    """Write a run (date, exact command line, its JSON lines) into a results file (``--record``): appended, or in
    place of run number ``replace`` (what an earlier call returned), so that a command which saves after each scheme
    keeps one entry, and a process killed outright keeps the schemes it finished. Returns the run's number."""
    results = read_results_file(path)
    runs = results["runs"]
    run = {
        "date": runs[replace]["date"] if replace is not None else datetime.datetime.now().isoformat(timespec="seconds"),
        "command": shlex.join(["python", script, *argv]),
        "output": records,
    }
    if replace is None:
        runs.append(run)
        replace = len(runs) - 1
    else:
        runs[replace] = run
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(results, indent=1) + "\n")
    return replace


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_step(step: Callable[[], object], warmup: int, steps: int, device: torch.device) -> tuple[float, float]:
    """Mean wall time of ``steps`` calls after ``warmup`` untimed ones, synced only at the window's ends.

    Also returns the CPU share the process got: its CPU time / (wall time x torch threads). Near 1 on an
    otherwise idle CPU; lower means other processes took cores and the timing is pessimistic. (On GPU it only
    says how busy the host was.)
    """
    for _ in range(warmup):
        step()
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    sync(device)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall / steps, cpu / (wall * torch.get_num_threads())


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    names = (
        [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        if cpuinfo.exists()
        else []
    )
    return f"{names[0] if names else 'CPU'}, {torch.get_num_threads()} threads"


def split_schemes(overrides: list[str]) -> tuple[list[str | None], list[str]]:
    """``pe=a,b`` -> ([a, b], the other overrides); without a pe override, the config's default scheme."""
    schemes: list[str | None] = [None]
    rest = []
    for override in overrides:
        if override.startswith("pe="):
            schemes = [name.strip() for name in override.split("=", 1)[1].split(",") if name.strip()]
        else:
            rest.append(override)
    return schemes, rest


def recorded_settings(
    cfg: DictConfig,
    raw_model: torch.nn.Module,
    train_step: TrainStep,
    device: torch.device,
    dtype: torch.dtype,
    args: argparse.Namespace,
) -> dict:
    """A record's "config": the model's size, the batch, and every setting that picks a kernel or a path."""
    t, m = cfg.train, cfg.model
    return {
        "n_layer": m.n_layer,
        "n_head": m.n_head,
        "n_embd": m.n_embd,
        "vocab_size": m.vocab_size,
        "n_params": raw_model.num_params(),
        "seq_len": t.seq_len,
        "batch_size": t.batch_size,
        "grad_accum_steps": t.grad_accum_steps,
        "dtype": str(dtype).split(".")[-1],
        "compile": train_step.compiled,  # false after a compilation that failed (training/step.py)
        "compile_mode": args.compile_mode,
        "sdpa_backend": args.sdpa_backend,
        "attn_backend": raw_model.attention_backend(device, dtype=dtype),
        "fused_ce": use_fused(m.fused_ce, device),
        "flex_kernel_options": dict(m.flex_kernel_options),
        "threads": torch.get_num_threads(),
        "warmup": args.warmup,
        "steps": args.steps,
        "torch": torch.__version__,
    }


def bench_scheme(cfg: DictConfig, args: argparse.Namespace) -> dict:
    t, m = cfg.train, cfg.model
    device, dtype = set_up_runtime(OmegaConf.to_object(t))
    compiled = compile_enabled(t.compile, device.type)
    vocab = m.vocab_size
    x = torch.randint(0, vocab, (t.batch_size, t.seq_len), device=device)
    y = torch.randint(0, vocab, (t.batch_size, t.seq_len), device=device)

    with PeakMemory(device) as train_memory:
        raw_model = build_model(cfg).to(device)
        optimizer = build_optimizer(raw_model, optimizer_settings(cfg), device)
        train_step = TrainStep(
            torch.compile(raw_model, mode=torch_compile_mode(args.compile_mode)) if compiled else raw_model,
            optimizer,
            build_scheduler(optimizer, optimizer_settings(cfg)),
            t.grad_accum_steps,
            t.grad_clip,
            device,
            dtype,
            eager=raw_model if compiled else None,
        )
        with reused_freed_memory():  # as the training loop steps
            step_s, cpu_share = seconds_per_step(functools.partial(train_step, x, y), args.warmup, args.steps, device)
    tokens_per_s = t.batch_size * t.seq_len / step_s
    peak = peak_flops(device)
    record = {
        "pe": cfg.pe.name,
        "device": device_name(device),
        "tokens_per_s": round(tokens_per_s, 1),
        "mfu": round(model_flops_per_token(raw_model, t.seq_len) * tokens_per_s / peak, 4) if peak else None,
        "peak_memory_mb": train_memory.peak_mb,
        "memory_metric": train_memory.metric,
        "step_ms": round(step_s * 1e3, 2),
        "cpu_share": round(cpu_share, 3),
        "config": recorded_settings(cfg, raw_model, train_step, device, dtype, args),
    }
    del train_step, optimizer
    raw_model.zero_grad(set_to_none=True)
    if args.eval_length:
        record["eval"] = bench_eval(raw_model, cfg, args, device, dtype)
    return record


def bench_or_error(cfg: DictConfig, args: argparse.Namespace) -> dict:
    """:func:`bench_scheme`'s record, or the scheme and the first line of what stopped it (a kernel the GPU does not
    compile, memory it does not have), so that one scheme's failure does not lose the others'."""
    try:
        with sdpa_backend(args.sdpa_backend):
            return bench_scheme(cfg, args)
    except PosGPTError:
        raise
    except Exception as error:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return {"pe": cfg.pe.name, "error": first_line(error)}


def bench_eval(
    raw_model: torch.nn.Module, cfg: DictConfig, args: argparse.Namespace, device: torch.device, dtype: torch.dtype
) -> dict:
    """Scoring at ``--eval-length`` as evaluation/extrapolation.py does it (per-token losses, no grad)."""
    length = args.eval_length
    rows = max(1, cfg.eval.batch_tokens // length)
    x = torch.randint(0, cfg.model.vocab_size, (rows, length), device=device)
    raw_model.eval()

    @torch.inference_mode()
    def score():
        with autocast(device, dtype):
            return raw_model(x, x, reduction="none")

    result = {"length": length, "batch": rows, "steps": args.eval_steps}  # what was timed, as config records
    try:
        with PeakMemory(device) as memory:
            step_s, _ = seconds_per_step(score, 1, args.eval_steps, device)
    except PosGPTError as error:  # e.g. a learned position table shorter than the length
        return result | {"error": str(error)}
    return result | {
        "tokens_per_s": round(rows * length / step_s, 1),
        "peak_memory_mb": memory.peak_mb,
        "step_ms": round(step_s * 1e3, 2),
    }


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = ArgumentParser(
        description=__doc__.split("\n\n")[0],
        usage="python scripts/speed.py [options] [hydra overrides, e.g. pe=<scheme>,<scheme> for several]",
    )
    add_common_args(parser)
    parser.add_argument(
        "--compile-mode",
        choices=COMPILE_MODES,
        default="default",
        help="torch.compile's mode for the training step (with train.compile=true): what each is worth on a GPU",
    )
    parser.add_argument(
        "--sdpa-backend",
        choices=list(SDPA_BACKENDS),
        default="auto",
        help="limit every scaled_dot_product_attention call to one of SDPA's CUDA implementations (flash, cuDNN's, "
        "memory-efficient), training and scoring: what each is worth on a GPU",
    )
    parser.add_argument(
        "--eval-length",
        type=count(1),
        default=None,
        reads=("eval.batch_tokens",),
        help="also time scoring (no grad) at this context length, e.g. 16x train.seq_len",
    )
    parser.add_argument(
        "--eval-steps",
        type=count(1),
        default=2,
        requires="--eval-length",
        help="timed evaluation batches (after one untimed)",
    )
    args, overrides = parser.parse_known_args(argv)
    unknown = [o for o in overrides if o.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args, overrides


@exit_on_user_error
def main(argv: list[str]) -> None:
    args, overrides = parse_args(argv)
    read_results_file(args.record)
    schemes, rest = split_schemes(overrides)
    configs = [compose_config(rest + ([f"pe={name}"] if name else [])) for name in schemes]
    for cfg in configs:
        validate(cfg, reads_data=False, keys=overridden_keys(rest), command="scripts/speed.py")  # random token ids
        if args.compile_mode != "default" and str(cfg.train.compile).lower() != "true":
            raise PosGPTError(f"--compile-mode {args.compile_mode} needs train.compile=true (it compiles nothing else)")
        if args.sdpa_backend != "auto" and select_device(cfg.train.device).type != "cuda":
            raise PosGPTError(
                f"--sdpa-backend {args.sdpa_backend} needs a CUDA device (the kernels it picks are CUDA's)"
            )
    records, run = [], None
    for cfg in configs:
        records.append(bench_or_error(cfg, args))
        print_record(records[-1])
        if args.record:  # after each scheme: a run stopped outright (SIGKILL) keeps the schemes it measured
            run = save_run(args.record, "scripts/speed.py", argv, records, run)
        torch._dynamo.reset()  # each scheme compiles its own model
    failed = [record["pe"] for record in records if "error" in record]
    if failed:  # recorded, and still not a success
        print(
            f"error: {len(failed)} of {len(records)} schemes failed ({', '.join(failed)}); see their records",
            file=sys.stderr,
        )
        raise SystemExit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
