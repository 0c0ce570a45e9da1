"""CoPE: the contextual-position logits against a loop over the paper's equations."""

import math

import torch

from model.kernels import attend
from model.pe import SCHEMES, ModelDims
from model.pe.cope import CoPEConfig

D, T, NPOS = 8, 9, 5
DIMS = ModelDims(n_embd=2 * D, n_head=2, head_dim=D, train_seq_len=T, init_std=0.02, n_layer=2)


def reference_bias(q, k, e):
    """Golovneva et al. 2024, eqs. 3-5, one head, written as loops: (T, T) with NaN where masked."""
    out = torch.full((T, T), float("nan"), dtype=torch.float64)
    for i in range(T):
        gates = [1 / (1 + math.exp(-(q[i] @ k[j]).item() / math.sqrt(D))) for j in range(i + 1)]
        for j in range(i + 1):
            p = min(sum(gates[j : i + 1]), NPOS - 1)
            lo, hi = math.floor(p), math.ceil(p)
            z_lo, z_hi = (q[i] @ e[:, lo]).item(), (q[i] @ e[:, hi]).item()
            out[i, j] = z_lo * (1 - (p - lo)) + z_hi * (p - lo)
    return out


def test_content_bias_matches_the_equations():
    torch.manual_seed(0)
    pe = SCHEMES["cope"](CoPEConfig(npos=NPOS), DIMS)
    with torch.no_grad():
        pe.pos_emb.normal_()
    q, k = torch.randn(1, 2, T, D) * 2, torch.randn(1, 2, T, D) * 2  # large: some counts reach the clamp
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    scores = (q @ k.transpose(-2, -1) / math.sqrt(D)).masked_fill(~causal, float("-inf"))
    got = pe.content_bias(q, scores, layer=1)
    for h in range(2):
        want = reference_bias(q[0, h], k[0, h], pe.pos_emb[1])
        torch.testing.assert_close(got[0, h][causal].double(), want[causal], rtol=1e-5, atol=1e-5)
    # and attention adds it to the logits
    v = torch.randn(1, 2, T, D)
    probs = torch.softmax(scores + got, dim=-1)
    torch.testing.assert_close(attend(q, k, v, pe, "auto", layer=1), probs @ v, rtol=1e-5, atol=1e-6)


def test_no_positions_and_a_table_without_weight_decay():
    pe = SCHEMES["cope"](CoPEConfig(), DIMS)
    assert not pe.uses_positions() and [p is pe.pos_emb for p in pe.no_weight_decay()] == [True]


def test_math_path_in_query_blocks_equals_one_block(monkeypatch):
    """CoPE runs the written-out path; long sequences are split into blocks of queries (bounded memory)."""
    import model.attention as attention

    torch.manual_seed(0)
    pe = SCHEMES["cope"](CoPEConfig(npos=NPOS), DIMS)
    with torch.no_grad():
        pe.pos_emb.normal_()
    q, k, v = (torch.randn(2, 2, 30, D, requires_grad=True) for _ in range(3))
    whole = attend(q, k, v, pe, "auto", layer=1)
    monkeypatch.setattr(attention, "_MAX_BLOCK_SCORES", 2 * 2 * 30 * 7)  # blocks of 7 queries
    torch.testing.assert_close(attend(q, k, v, pe, "auto", layer=1), whole, rtol=1e-5, atol=1e-6)
