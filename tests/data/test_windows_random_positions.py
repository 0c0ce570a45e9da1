"""Randomized positions (Ruoss et al. 2023): the draw, the model at per-row positions for every scheme, the
refusals, and one training run through train.py."""

import json

import numpy as np
import pytest
import torch
from cli_runs import train_losses

from core.errors import PosGPTError
from data import TokenArray
from data.tasks import build_task
from data.tasks.passkey import PasskeyConfig
from data.windows import random_positions
from evaluation.task_accuracy import count_exact_matches
from model import GPT, ModelConfig
from model.pe import SCHEMES
from model.pe.learned import LearnedConfig
from training.batch_stream import BatchStream
from training.distributed import DistInfo

T, N = 12, 64


def tiny(name, backend="math"):
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=4, n_embd=32, vocab_size=300, attn_backend=backend)
    pe_cfg = LearnedConfig(max_positions=N) if name == "learned" else SCHEMES[name].config_class()
    return GPT(cfg, pe_cfg, train_seq_len=T)


def trains_with_random_positions(name: str) -> bool:
    """Whether the scheme, as configured by default, accepts train.random_positions=N (a length scaling by position
    refuses it)."""
    try:
        tiny(name).pe.check_random_positions(N)
    except PosGPTError:
        return False
    return True


POSITIONAL = sorted(name for name in SCHEMES if SCHEMES[name].uses_positions() and trains_with_random_positions(name))


def test_draw_is_a_sorted_subset_per_row_and_reproducible():
    positions = random_positions(8, T, N, torch.Generator().manual_seed(0))
    assert positions.shape == (8, T) and positions.dtype == torch.long
    assert (positions.diff(dim=1) > 0).all() and positions.min() >= 0 and positions.max() < N
    assert not torch.equal(positions[0], positions[1])  # each row its own
    assert torch.equal(positions, random_positions(8, T, N, torch.Generator().manual_seed(0)))


def test_batch_stream_resumes_the_same_positions(tmp_path):
    shard = tmp_path / "shard.bin"
    (np.arange(1000) % 50).astype(np.uint16).tofile(shard)
    tokens = TokenArray([shard], name="train")
    stream = BatchStream(tokens, 4, T, 0, DistInfo(), torch.device("cpu"), random_positions=N)
    stream.next()
    state = stream.sampler_state
    expected = stream.next()
    resumed = BatchStream(tokens, 4, T, 0, DistInfo(), torch.device("cpu"), state=state, random_positions=N)
    for got, want in zip(resumed.next(), expected):
        assert torch.equal(got, want)


@pytest.mark.parametrize("name", POSITIONAL)
def test_per_row_positions_equal_each_row_on_its_own(name):
    """(B, T) positions: row b computes what the model computes at positions[b] alone; sdpa equals math,
    forward and backward; arange positions equal the default."""
    model = tiny(name)
    idx = torch.randint(0, 300, (3, T))
    positions = random_positions(3, T, N, torch.Generator().manual_seed(1))
    together = model(idx, positions=positions)
    for b in range(3):
        torch.testing.assert_close(
            together[b : b + 1], model(idx[b : b + 1], positions=positions[b]), rtol=1e-4, atol=1e-5
        )
    assert not torch.allclose(together, model(idx), atol=1e-4)  # the positions matter
    torch.testing.assert_close(model(idx, positions=torch.arange(T)), model(idx), rtol=1e-5, atol=1e-6)
    grads = []
    for backend in ("math", "sdpa"):
        m = tiny(name, backend)
        m(idx, idx, positions=positions).backward()
        grads.append({n: p.grad for n, p in m.named_parameters() if p.grad is not None})
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-4, atol=1e-6, msg=n)


def test_schemes_that_cannot_use_random_positions_refuse_clearly():
    for name in ("none", "cope"):
        with pytest.raises(PosGPTError, match="does not use token positions"):
            tiny(name).pe.check_random_positions(N)
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=300), LearnedConfig(), train_seq_len=T)
    with pytest.raises(PosGPTError, match="at most 12 positions"):
        model.pe.check_random_positions(N)
    tiny("rope").pe.check_random_positions(10**6)  # defined everywhere: fine
    with pytest.raises(PosGPTError, match="KV cache"):
        from model import KVCache

        model(torch.zeros(1, 2, dtype=torch.long), cache=KVCache(), positions=torch.arange(2))


@pytest.mark.slow
def test_train_py_with_random_positions(cli, tmp_path):
    done = cli.train_here(tmp_path / "run", "pe=alibi", "train.max_steps=3", "train.random_positions=256")
    assert done.returncode == 0, done.stderr
    assert sorted(train_losses(tmp_path / "run")) == [1, 2, 3]
    # pe=learned: a table of 16 positions
    refused = cli.train_here(tmp_path / "bad", "train.max_steps=3", "train.random_positions=256")
    assert refused.returncode == 2 and "random_positions=256" in refused.stderr


def test_an_instance_takes_as_many_positions_as_its_tokens_from_the_whole_range():
    """A right-padded instance of n tokens gets a sorted uniform n-subset of [0, N) (Ruoss et al.), not the n
    smallest of seq_len draws; its pads repeat its last position; full rows are the draw without lengths."""
    lengths = torch.tensor([1, 5, T, 3] * 50)
    positions = random_positions(200, T, N, torch.Generator().manual_seed(2), lengths)
    assert torch.equal(positions[2::4], random_positions(200, T, N, torch.Generator().manual_seed(2))[2::4])
    for row, n in zip(positions, lengths.tolist()):
        assert (row[:n].diff() > 0).all() and row.min() >= 0 and row.max() < N
        assert (row[n:] == row[n - 1]).all()
    # One token's position is uniform over [0, N) (mean (N - 1) / 2 = 31.5); the smallest of T draws would
    # average N / (T + 1) < 5.
    assert positions[0::4, 0].float().mean() > N / 4


def test_a_task_batch_stream_draws_positions_for_each_instance_length():
    task = build_task(PasskeyConfig())
    stream = BatchStream(task, 16, 64, 0, DistInfo(), torch.device("cpu"), random_positions=1024)
    generator = torch.Generator().manual_seed(0)
    _, _, lengths = task.training_instances(16, 64, generator)
    x, y, positions = stream.next()
    expected = random_positions(16, 64, 1024, generator, lengths)
    assert torch.equal(positions, expected) and len(set(lengths.tolist())) > 1
    fixed = build_task(PasskeyConfig(train_lengths="fixed"))
    plain = BatchStream(fixed, 16, 64, 0, DistInfo(), torch.device("cpu"), random_positions=1024).next()[2]
    generator = torch.Generator().manual_seed(0)
    fixed.training_batch(16, 64, generator)
    assert torch.equal(plain, random_positions(16, 64, 1024, generator))  # one layout: the draw as before


def test_counting_matches_scores_each_example_at_its_positions_0_to_l_minus_1_by_default():
    """A model whose prediction at each token is its position: the targets equal to the positions given match."""

    def predicts_position(x, positions=None):
        at = torch.arange(x.shape[1]).expand_as(x) if positions is None else positions
        return torch.nn.functional.one_hot(at, N).float()

    cpu = torch.device("cpu")
    x = torch.zeros(5, T, dtype=torch.long)
    drawn = random_positions(5, T, N, torch.Generator().manual_seed(0))

    def correct(targets: torch.Tensor, positions: torch.Tensor | None) -> int:
        return count_exact_matches(predicts_position, x, targets, 2 * T, cpu, torch.float32, positions).correct

    assert correct(drawn, drawn) == 5  # in 3 batches
    assert correct(drawn, None) == 0 and correct(torch.arange(T).expand(5, T), None) == 5


@pytest.mark.slow
def test_eval_at_random_positions_adds_its_rows_and_refuses_what_it_cannot_score(cli, tmp_path, reference):
    run = tmp_path / "run"
    small = ["task=passkey", "pe=rope", "train.seq_len=32", "task.key_len=2", "task.filler_len=3"]
    done = cli.train_here(run, *small, "train.max_steps=4", "train.random_positions=128")
    assert done.returncode == 0, done.stderr
    for extra in ([], ["eval.random_positions=true", "eval.lengths=[16,32,128]"]):
        again = cli.eval_here(run, "eval.lengths=[16,32]", *extra)
        assert again.returncode == 0, again.stderr
    rows = json.loads((run / "eval" / "tasks.json").read_text())["results"]
    labels = {(row["length"], row["random_positions"]) for row in rows if row["depth"] is None}
    assert labels == {(16, None), (32, None), (16, 128), (32, 128), (128, 128)}
    assert "randpos:128 " in again.stdout  # the table's row label
    refusals = {
        "eval.lengths=[256]": "lengths [256] do not fit",
        "eval.lengths=[16]": None,
    }
    for override, message in refusals.items():
        result = cli.eval_here(run, "eval.random_positions=true", override)
        assert (result.returncode, message is None or message in result.stderr) == (2 if message else 0, True)
    plain = cli.eval_here(reference, "eval.random_positions=true")
    assert plain.returncode == 2 and "eval.random_positions=true is read only by a task run" in plain.stderr
