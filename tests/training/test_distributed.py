"""torchrun on CPU (gloo): two processes train like one with the same global batch, with DDP and FSDP2."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_runs import REPO, STEPS, TIMEOUT_S, train_losses, wait_for_step

from core.checkpoint_io import load_checkpoint

TOLERANCE = 1e-4  # summation order differs across processes; observed differences are ~1e-6


@pytest.mark.slow
def test_ddp_then_fsdp_match_one_process(cli, reference, tmp_path):
    reference = train_losses(reference)
    run_dir = tmp_path / "run"
    # Each rank takes 2 of the 4 rows and accumulates them in 2 micro-steps (no_sync on the first).
    ddp = cli.torchrun(run_dir, f"train.max_steps={STEPS // 2}", "train.grad_accum_steps=2")
    assert ddp.returncode == 0, ddp.stdout + ddp.stderr
    assert ddp.stdout.count("train: pe=") == 1 and "world=2" in ddp.stdout  # only rank 0 prints
    # The DDP checkpoint continues under FSDP2: checkpoints hold full state dicts whatever wrote them.
    fsdp = cli.torchrun(
        run_dir, f"train.max_steps={STEPS}", "train.resume=true", "train.distributed=fsdp", "train.grad_accum_steps=2"
    )
    assert fsdp.returncode == 0, fsdp.stdout + fsdp.stderr

    losses = train_losses(run_dir)
    assert list(losses) == list(range(1, STEPS + 1))  # every step logged once: only rank 0 writes
    differences = [abs(losses[step] - reference[step]) for step in reference]
    print(f"max |2-process loss - 1-process loss| over {STEPS} steps: {max(differences):.2e}")
    assert max(differences) < TOLERANCE
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert state["step"] == STEPS
    assert state["model"]["token_embedding.weight"].shape == (50304, 16)  # gathered, not a shard


def worker_of_rank(launcher: subprocess.Popen, rank: int) -> int:
    """The pid of torchrun's worker process with this RANK."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                environ = (proc / "environ").read_bytes().split(b"\0")
                if parent == launcher.pid and f"RANK={rank}".encode() in environ:
                    return int(proc.name)
        time.sleep(0.05)
    raise AssertionError(f"no worker of rank {rank} under torchrun {launcher.pid}")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds torchrun's workers through /proc")
def test_a_signal_to_one_rank_stops_every_rank_at_the_same_saved_step(cli, tmp_path):
    """Only rank 1 is signalled (a node's SIGTERM, say): both ranks agree to stop at a logging step, save one
    checkpoint, and rank 0, which received nothing, reports the stop; no rank trains on alone."""
    run_dir = tmp_path / "run"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py"]
        + cli.overrides(run_dir, "train.max_steps=100000", "train.log_every=2", "train.checkpoint_every=100000"),
        cwd=REPO,
        env=cli.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for_step(launcher, run_dir, 2)
        os.kill(worker_of_rank(launcher, 1), signal.SIGTERM)
        output, _ = launcher.communicate(timeout=TIMEOUT_S)
    finally:
        launcher.kill()
    step = load_checkpoint(run_dir)["step"]
    assert step % 2 == 0 and f"train: stopped by SIGTERM at step {step}; checkpoint saved" in output, output
    assert max(train_losses(run_dir)) == step
