"""torchrun on CPU (gloo): two processes train like one with the same global batch, with DDP and FSDP2."""

import pytest
import torch
from cli_runs import STEPS, train_losses

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
