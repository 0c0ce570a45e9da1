"""The learned table (model/pe/learned.py): its size and its initialisation."""

import pytest
import torch
from pe_schemes import DIMS, FAIRSEQ_DIMS, build

from model.pe.learned import LearnedConfig


def test_learned_table_size_is_training_length_by_default():
    pe = build("learned", LearnedConfig())
    assert pe.max_positions() == DIMS.train_seq_len
    assert pe.beyond_reach(DIMS.train_seq_len) is None  # the evaluators' reason for lengths past the table
    assert pe.beyond_reach(DIMS.train_seq_len + 1) == f"pe=learned encodes at most {DIMS.train_seq_len} positions"


@pytest.mark.parametrize("dims, std", [(DIMS, 0.02), (FAIRSEQ_DIMS, 32**-0.5)], ids=["gpt2", "fairseq"])
def test_learned_table_starts_like_the_token_table(dims, std):
    """fairseq: N(0, d^-1/2) (its PositionalEmbedding(learned=True)); GPT-2: N(0, 0.02). 131K samples: the
    sample std is within 0.5% of the true one (4 standard errors), so 2% tells the conventions apart."""
    torch.manual_seed(0)
    table = build("learned", LearnedConfig(max_positions=4096), dims).table.weight
    assert table.mean().item() == pytest.approx(0.0, abs=4 * std / table.numel() ** 0.5)
    assert table.std().item() == pytest.approx(std, rel=0.02)
