"""Predict a config's parameters, memory and FLOPs before launching it (experiment/estimate.py's model).

    python scripts/estimate.py model=gpt2 train.seq_len=1024 --eval-length 16384
    python scripts/estimate.py train.batch_size=8 --measure          # check the prediction on this machine

Takes train.py's Hydra overrides. Prints one JSON object: parameters, FLOPs per training token, training
memory by part (fp32 and bf16 autocast) and, with ``--eval-length N``, scoring memory at N tokens per
attention backend, in MiB. Nothing is allocated (the model is built on the meta device).

``--measure`` also runs the work here (two training steps; with --eval-length, one scoring batch on the
default backend) and reports evaluation/memory.py's measured peak less the process's size before the model
was built, next to the prediction, and their ratio. On CPU it first makes glibc return freed blocks to the
system (core/host_memory.return_freed_memory), so the resident peak is that of live tensors; measure one
thing per process: without --eval-length it measures training, with it scoring.

``--record FILE`` is checked (a results file of scripts/speed.py or a new one, outside any run, writable) before
the config is composed or anything measured.
"""

from __future__ import annotations

import _repo  # noqa: F401

import argparse
import json
import sys
import typing
from pathlib import Path

import torch
from omegaconf import OmegaConf
from speed import device_name, read_results_file, save_run

from core.cli import ArgumentParser, count, exit_on_user_error
from core.config_keys import overridden_keys
from core.files import check_writable
from core.host_memory import return_freed_memory
from core.runtime import RuntimeSettings, autocast, set_up_runtime
from core.settings import declared_settings
from evaluation.memory import PeakMemory, resident_mb
from experiment.build import build_model
from experiment.compose import compose_config
from experiment.config import validate
from experiment.estimate import count_parameters, flops_per_token, scoring_memory, training_memory
from experiment.plan import optimizer_settings
from training.optim import OptimizerSettings, build_optimizer, build_scheduler
from training.step import TrainStep

# What only the measurement reads (the prediction is of fp32 on a CPU and bf16 on CUDA, of no optimizer step): the
# runtime (core.runtime.set_up_runtime) and the optimizer and its schedule
MEASURED = tuple(f"train.{name}" for name in typing.get_type_hints(RuntimeSettings)) + tuple(
    f"train.{item.name}" for item in declared_settings(OptimizerSettings)
)


def measure(cfg, eval_length: int | None) -> tuple[dict, float]:
    """(what was measured, the measured peak growth in MiB) on train.device in train.dtype."""
    t = cfg.train
    device, dtype = set_up_runtime(OmegaConf.to_object(t))
    if device.type == "cpu":
        return_freed_memory()
    before = resident_mb() if device.type == "cpu" else 0.0
    with PeakMemory(device) as memory:
        model = build_model(cfg).to(device)
        if eval_length:
            rows = max(1, cfg.eval.batch_tokens // eval_length)
            x = torch.randint(0, cfg.model.vocab_size, (rows, eval_length), device=device)
            with torch.inference_mode(), autocast(device, dtype):
                model.eval()(x, x, reduction="none")
            what = {"work": "scoring", "length": eval_length, "rows": rows}
        else:
            settings = optimizer_settings(cfg)
            optimizer = build_optimizer(model, settings, device)
            scheduler = build_scheduler(optimizer, settings)
            step = TrainStep(model, optimizer, scheduler, t.grad_accum_steps, 0.0, device, dtype)
            x = torch.randint(0, cfg.model.vocab_size, (t.batch_size, t.seq_len), device=device)
            for _ in range(2):
                step(x, x)
            what = {"work": "training", "seq_len": t.seq_len, "batch_size": t.batch_size}
    backend = model.attention_backend(device, dtype=dtype)
    what |= {
        "backend": backend,
        "dtype": dtype,
        "device": device_name(device),
        "memory_metric": memory.metric,
        "process_before_mb": before,
    }
    return what, memory.peak_mb - before


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The options, and the Hydra overrides that follow or precede them."""
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--eval-length",
        type=count(1),
        default=None,
        reads=("eval.batch_tokens",),
        help="also predict scoring at this length",
    )
    parser.add_argument("--measure", action="store_true", reads=MEASURED, help="run it here and compare (see above)")
    parser.add_argument("--record", type=Path, default=None, help="also append the report to a results file")
    return parser.parse_known_args(argv)


@exit_on_user_error
def main(argv: list[str]) -> None:
    args, overrides = parse_args(argv)
    read_results_file(args.record)  # a file that is not a results file, or one in a run: refused before any work
    check_writable({"--record": args.record})
    cfg = compose_config(overrides)
    validate(cfg, reads_data=False, keys=overridden_keys(overrides), command="scripts/estimate.py")  # random ids
    report = {
        "pe": cfg.pe.name,
        "parameters": count_parameters(cfg),
        "flops_per_token": flops_per_token(cfg),
        "training_mib": {
            "cpu_fp32": training_memory(cfg, "cpu").mib(),
            "cuda_bf16": training_memory(cfg, "cuda", torch.bfloat16).mib(),
        },
    }
    if args.eval_length:
        report["scoring_mib"] = {
            "length": args.eval_length,
            "rows": max(1, cfg.eval.batch_tokens // args.eval_length),
            "cpu_fp32": {b: scoring_memory(cfg, args.eval_length, b).mib() for b in ("math", "sdpa")},
            "cuda_bf16": {
                b: scoring_memory(cfg, args.eval_length, b, torch.bfloat16).mib() for b in ("math", "sdpa", "flex")
            },
        }
    if args.measure:
        what, measured = measure(cfg, args.eval_length)
        device, dtype = "cuda" if what["memory_metric"].startswith("cuda") else "cpu", what.pop("dtype")
        predicted = (
            scoring_memory(cfg, args.eval_length, what["backend"], dtype).total
            if args.eval_length
            else training_memory(cfg, device, dtype).total
        ) / 2**20
        report["measured"] = what | {
            "dtype": str(dtype).split(".")[-1],
            "predicted_mb": round(predicted, 1),
            "measured_growth_mb": round(measured, 1),
            "predicted_over_measured": round(predicted / measured, 3),
        }
    print(json.dumps(report, indent=1))
    if args.record:
        save_run(args.record, "scripts/estimate.py", argv, [report])


if __name__ == "__main__":
    main(sys.argv[1:])
