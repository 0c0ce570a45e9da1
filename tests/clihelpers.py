"""Running posgpt's real command lines from tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def small_corpus(directory: Path, n_files: int = 6) -> list[str]:
    """A few standard-library modules as plain-text documents: real English and code, present everywhere."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in ["argparse", "textwrap", "string", "fractions", "calendar", "difflib", "shlex", "heapq"][:n_files]:
        target = directory / f"{name}.txt"
        target.write_text((stdlib / f"{name}.py").read_text())
        paths.append(str(target))
    return paths


def tiny_overrides(files: list[str], run_dir: Path, **extra: object) -> list[str]:
    """A model and run small enough for a few seconds of CPU."""
    overrides = {
        "data": "text",
        "data.files": "[" + ",".join(files) + "]",
        "data.val_fraction": 0.2,
        "model.n_layer": 1,
        "model.n_head": 2,
        "model.n_embd": 32,
        "train.seq_len": 16,
        "train.batch_size": 16,
        "train.max_steps": 12,
        "train.warmup_steps": 0,
        "train.lr": 1e-2,
        "train.log_every": 1,
        "train.val_every": 4,
        "train.val_batches": 2,
        "train.checkpoint_every": 4,
        "eval.max_tokens": 256,
        "logging.progress": "false",
        "hydra.run.dir": str(run_dir),
    }
    overrides.update({k: v for k, v in extra.items()})
    return [f"{k}={v}" for k, v in overrides.items()]


def run_cli(script: str, args: list[str], env_extra: dict[str, str] | None = None, timeout: int = 300,
            check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_SILENT": "true", **(env_extra or {})}
    result = subprocess.run([sys.executable, str(REPO / script), *args], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{script} {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
