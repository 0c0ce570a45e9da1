"""T5 relative buckets: the bucket function against Hugging Face's numbers, and the bias built from it."""

import torch
from reference_numbers import REFERENCE_NUMBERS

from model.pe import SCHEMES, ModelDims
from model.pe import capabilities as cap
from model.pe.t5 import T5Config, t5_bucket

DIMS = ModelDims(n_embd=32, n_head=4, head_dim=8, train_seq_len=16, init_std=0.02, n_layer=2)


def test_buckets_match_hugging_faces():
    # transformers' T5Attention._relative_position_bucket, causal, over key - query = -1999 .. 5
    for case in REFERENCE_NUMBERS["t5_buckets"]:
        query_minus_key = -torch.tensor(case["relative_position"])
        assert t5_bucket(query_minus_key, case["num_buckets"], case["max_distance"]).tolist() == case["bucket"]
    # A few by hand: exact below 16, then log-spaced; 128 and beyond share the last bucket.
    got = t5_bucket(torch.arange(-5, 2000), 32, 128).tolist()
    assert [got[d + 5] for d in (0, 15, 16, 20, 32, 64, 127, 128, 1999)] == [0, 15, 16, 17, 21, 26, 31, 31, 31]
    assert got[:5] == [0] * 5  # future keys (masked anyway) count as distance 0


def test_bias_is_the_table_entry_shared_by_layers():
    pe = SCHEMES["t5"](T5Config(), DIMS)
    q_pos, k_pos = torch.arange(300)[:, None], torch.arange(300)[None, :]
    heads = torch.arange(4)[:, None, None]
    bias = pe.score_bias(q_pos, k_pos, heads, 0)
    expected = pe.table[t5_bucket(q_pos - k_pos, 32, 128)].permute(2, 0, 1)
    torch.testing.assert_close(bias, expected)
    torch.testing.assert_close(pe.score_bias(q_pos, k_pos, heads, 1), bias)
    assert not issubclass(SCHEMES["t5"], cap.LayerwiseBias)
    assert [p is pe.table for p in pe.no_weight_decay()] == [True]
