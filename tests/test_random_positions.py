"""Randomized positions (Ruoss et al. 2023): the draw, the model at per-row positions for every scheme, the
refusals, and one training run through train.py."""

import numpy as np
import pytest
import torch
from cli_runs import train_losses

from core.errors import PosGPTError
from data import TokenArray
from model import GPT, ModelConfig
from model.pe import SCHEMES
from model.pe.learned import LearnedConfig
from training.batch_stream import BatchStream, random_positions
from training.distributed import DistInfo

POSITIONAL = sorted(name for name in SCHEMES if SCHEMES[name].uses_positions())
T, N = 12, 64


def tiny(name, backend="math"):
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=4, n_embd=32, vocab_size=300, attn_backend=backend)
    pe_cfg = LearnedConfig(max_positions=N) if name == "learned" else SCHEMES[name].config_class()
    return GPT(cfg, pe_cfg, train_seq_len=T)


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
