"""nanoGPT's training step, timed exactly like scripts/speed.py times posgpt's, for a side-by-side comparison.

    python scripts/speed_nanogpt.py --model-py /tmp/nanogpt/model.py --n-layer 4 --n-head 4 --n-embd 256 \
        --seq-len 256 --batch-size 8
    python scripts/speed.py pe=learned model.n_layer=4 model.n_head=4 model.n_embd=256 train.seq_len=256 \
        train.batch_size=8

nanoGPT (github.com/karpathy/nanoGPT, MIT) is not part of posgpt: fetch its model.py yourself and pass its
path. The step follows nanoGPT's train.py: GPT(GPTConfig(...)) with vocab 50304, dropout 0 and bias=True (its
defaults), configure_optimizers(weight_decay=0.1, learning_rate=6e-4, betas=(0.9, 0.95), device_type), the
learning rate set on every param group each iteration, forward under its autocast context (fp32 on CPU,
bf16 on CUDA), backward, clip_grad_norm_(1.0), step, zero_grad(set_to_none=True); torch.compile as its
train.py does on CUDA and as its README's CPU example does not. The JSON line has speed.py's fields.
"""

from __future__ import annotations

import _repo

import argparse
import contextlib
import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import torch

# importing speed also puts the repository root on sys.path, for core.runtime and evaluation.memory
from speed import add_common_args, device_name, print_record, read_results_file, save_run, seconds_per_step

from core.cli import ArgumentParser, count, exit_on_user_error
from core.runtime import flops_per_token, peak_flops
from evaluation.memory import PeakMemory

VOCAB_SIZE = 50304  # nanoGPT's default: GPT-2's 50257 padded to a multiple of 64, as posgpt pads it


def load_nanogpt(path: Path):
    """Import nanoGPT's model.py under its own name (posgpt already has a package called ``model``)."""
    if not path.is_file():
        sys.exit(f"error: --model-py {path} is not a file; fetch nanoGPT's model.py first")
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-py", type=Path, required=True, help="path to nanoGPT's model.py")
    add_common_args(parser)
    parser.add_argument("--n-layer", type=count(1), default=4)
    parser.add_argument("--n-head", type=count(1), default=4)
    parser.add_argument("--n-embd", type=count(1), default=256)
    parser.add_argument("--seq-len", type=count(1), default=256)
    parser.add_argument("--batch-size", type=count(1), default=8)
    parser.add_argument("--threads", type=count(1), default=2, help="torch.set_num_threads on CPU")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv: list[str]) -> None:
    args = parse_args(argv)
    read_results_file(args.record)
    nanogpt = load_nanogpt(args.model_py)
    device = torch.device(args.device)
    bf16 = set_up_device(device, args.threads)
    model, step_s, cpu_share, memory = time_steps(nanogpt, args, device, bf16)
    record = bench_record(args, device, bf16, model, step_s, cpu_share, memory)
    print_record(record)
    if args.record:
        save_run(args.record, "scripts/speed_nanogpt.py", argv, [record])


def set_up_device(device: torch.device, threads: int) -> bool:
    """The device's settings as nanoGPT's train.py makes them; returns whether it trains in bf16 (on CUDA, when
    supported; fp32 on CPU)."""
    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        torch.set_num_threads(threads)
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return bf16


def time_steps(
    nanogpt: ModuleType, args: argparse.Namespace, device: torch.device, bf16: bool
) -> tuple[torch.nn.Module, float, float, PeakMemory]:
    """nanoGPT's model built and its training step timed on one fixed random batch: the model, the seconds per
    step, the CPU's share of them and the peak memory."""
    # nanoGPT's train.py: bf16 autocast on CUDA (when supported), a nullcontext (fp32) on CPU; compile on CUDA.
    ctx = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    torch.manual_seed(1337)
    x = torch.randint(0, VOCAB_SIZE, (args.batch_size, args.seq_len), device=device)
    y = torch.randint(0, VOCAB_SIZE, (args.batch_size, args.seq_len), device=device)

    with PeakMemory(device) as memory:
        config = nanogpt.GPTConfig(
            block_size=args.seq_len,
            vocab_size=VOCAB_SIZE,
            n_layer=args.n_layer,
            n_head=args.n_head,
            n_embd=args.n_embd,
            dropout=0.0,
            bias=True,
        )
        model = nanogpt.GPT(config).to(device)
        optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device.type)
        net = torch.compile(model) if device.type == "cuda" else model

        def step() -> None:
            for group in optimizer.param_groups:
                group["lr"] = 6e-4
            with ctx:
                _, loss = net(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        step_s, cpu_share = seconds_per_step(step, args.warmup, args.steps, device)
    return model, step_s, cpu_share, memory


def bench_record(
    args: argparse.Namespace,
    device: torch.device,
    bf16: bool,
    model: torch.nn.Module,
    step_s: float,
    cpu_share: float,
    memory: PeakMemory,
) -> dict:
    """The JSON line, with scripts/speed.py's fields."""
    tokens_per_s = args.batch_size * args.seq_len / step_s
    peak = peak_flops(device)
    flops = flops_per_token(model.get_num_params(), args.n_layer, args.n_embd, args.seq_len)
    return {
        "pe": "learned",
        "impl": "nanoGPT",
        "device": device_name(device),
        "tokens_per_s": round(tokens_per_s, 1),
        "mfu": round(flops * tokens_per_s / peak, 4) if peak else None,
        "peak_memory_mb": memory.peak_mb,
        "memory_metric": memory.metric,
        "step_ms": round(step_s * 1e3, 2),
        "cpu_share": round(cpu_share, 3),
        "config": {
            "n_layer": args.n_layer,
            "n_head": args.n_head,
            "n_embd": args.n_embd,
            "vocab_size": VOCAB_SIZE,
            "n_params": sum(p.numel() for p in model.parameters()),
            "seq_len": args.seq_len,
            "batch_size": args.batch_size,
            "dtype": "bfloat16" if bf16 else "float32",
            "compile": device.type == "cuda",
            "threads": torch.get_num_threads(),
            "warmup": args.warmup,
            "steps": args.steps,
            "torch": torch.__version__,
            "model_py_sha256": hashlib.sha256(args.model_py.read_bytes()).hexdigest(),
        },
    }


if __name__ == "__main__":
    main(sys.argv[1:])
