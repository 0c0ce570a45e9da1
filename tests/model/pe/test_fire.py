"""FIRE: the bias equals the paper's reference forward pass, per layer, and the two ways to compute it agree."""

import math

import torch

from model.pe import SCHEMES, ModelDims
from model.pe.fire import FireConfig

DIMS = ModelDims(n_embd=32, n_head=4, head_dim=8, train_seq_len=16, init_std=0.02, n_layer=2)


def reference_fire(fire, seq_len, init_L):
    """Hand transcription of the FIRE module's forward in Li et al. 2023's appendix (also mcleish7/arithmetic):
    positions 0..T-1, rel = i - j, normalizer = max(i, |L_multiplier * init_L|), both through log(|c x| + 1),
    + 1e-6 on the normalizer, then the MLP; returns (H, T, T)."""
    out = torch.empty(fire.fc2.out_features, seq_len, seq_len)
    c, threshold = fire.c.item(), abs(fire.L_multiplier.item() * init_L)
    for i in range(seq_len):
        for j in range(seq_len):
            x = math.log(abs(c * (i - j)) + 1) / (math.log(abs(c * max(i, threshold)) + 1) + 1e-6)
            out[:, i, j] = fire.fc2(torch.relu(fire.fc1(torch.tensor([x]))))
    return out


def test_bias_matches_the_reference_on_the_causal_part():
    torch.manual_seed(0)
    cfg = FireConfig(init_L=8.0)  # a small threshold, so both branches of max(i, L) occur in 20 positions
    pe = SCHEMES["fire"](cfg, DIMS)
    with torch.no_grad():
        pe.layers[1].c.fill_(0.3)
        pe.layers[1].L_multiplier.fill_(1.5)
    positions = torch.arange(20)
    causal = positions[None, :] <= positions[:, None]
    for layer in (0, 1):
        want = reference_fire(pe.layers[layer], 20, cfg.init_L)
        got = pe.bias_block(positions, positions, layer)
        torch.testing.assert_close(got[:, causal], want[:, causal], rtol=1e-5, atol=1e-6)
        heads = torch.arange(4)[:, None, None]
        elementwise = pe.score_bias(positions[:, None], positions[None, :], heads, layer)  # the score_mod form
        torch.testing.assert_close(elementwise, got, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(pe.bias_block(positions, positions, 0), pe.bias_block(positions, positions, 1))


def test_c_and_threshold_are_learned():
    pe = SCHEMES["fire"](FireConfig(init_L=8.0), DIMS)
    pe.bias_block(torch.arange(20), torch.arange(20), 0).sum().backward()
    assert pe.layers[0].c.grad != 0 and pe.layers[0].L_multiplier.grad != 0
    assert pe.layers[1].c.grad is None  # layer 1's parameters are its own
