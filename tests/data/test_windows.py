"""Batch sampling (data/windows.py): deterministic, shifted targets, and enough tokens."""

import numpy as np
import pytest
import torch
from data_files import token_array

from core.errors import PosGPTError
from data import (
    sample_batch,
)

pytestmark = pytest.mark.usefixtures("cache_dir")  # every test writes its token cache under its own tmp_path


def test_sample_batch_is_deterministic_and_shifted(tmp_path):
    tokens, expected = token_array(tmp_path, [300, 200, 500])
    generator = torch.Generator().manual_seed(1234)
    state = generator.get_state()
    x, y = sample_batch(tokens, 8, 32, generator)
    assert x.shape == y.shape == (8, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    starts = torch.randint(0, 1000 - 33, (8,), generator=torch.Generator().manual_seed(1234))
    for row, start in zip(x, starts, strict=True):
        assert np.array_equal(row.numpy(), expected[start : start + 32])

    generator.set_state(state)  # what resuming from a checkpoint does
    x_again, y_again = sample_batch(tokens, 8, 32, generator)
    assert torch.equal(x, x_again) and torch.equal(y, y_again)
    assert not torch.equal(x, sample_batch(tokens, 8, 32, generator)[0])


def test_sample_batch_needs_enough_tokens(tmp_path):
    tokens, _ = token_array(tmp_path, [40])
    tokens.name = "val"
    with pytest.raises(PosGPTError, match="the val split has 40 tokens, fewer than seq_len\\+2=65"):
        sample_batch(tokens, 2, 63, torch.Generator())
    assert sample_batch(tokens, 2, 38, torch.Generator())[0].shape == (2, 38)
