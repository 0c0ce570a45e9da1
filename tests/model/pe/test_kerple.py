"""KERPLE: both kernels' equations, the positivity clamps of the reference code, and per-layer parameters."""

import math

import pytest
import torch

from core.errors import PosGPTError
from model.pe import SCHEMES, ModelDims
from model.pe.kerple import KerpleConfig

DIMS = ModelDims(n_embd=32, n_head=4, head_dim=8, train_seq_len=16, init_std=0.02, n_layer=2)
Q, K = torch.arange(12)[:, None], torch.arange(12)[None, :]
HEADS = torch.arange(4)[:, None, None]


def kerple(kernel):
    torch.manual_seed(0)
    return SCHEMES["kerple"](KerpleConfig(kernel=kernel), DIMS)


def test_log_kernel_is_minus_r1_log_one_plus_r2_distance():
    pe = kerple("log")
    for layer in (0, 1):
        bias = pe.score_bias(Q, K, HEADS, layer)
        for h in range(4):
            r1, r2 = pe.bias_p[layer, h].item(), pe.bias_a[layer, h].item()
            for i, j in [(0, 0), (5, 2), (11, 0)]:
                assert bias[h, i, j].item() == pytest.approx(-r1 * math.log(1 + r2 * (i - j)), rel=1e-5)
    assert not torch.allclose(pe.score_bias(Q, K, HEADS, 0), pe.score_bias(Q, K, HEADS, 1))  # per layer


def test_power_kernel_is_minus_a_distance_to_the_p():
    pe = kerple("power")
    bias = pe.score_bias(Q, K, HEADS, 1)
    for h in range(4):
        a, p = pe.bias_a[1, h].item(), pe.bias_p[1, h].item()
        assert bias[h, 9, 2].item() == pytest.approx(-a * 7**p, rel=1e-5)
        assert bias[h, 3, 3].item() == 0.0


def test_parameters_are_clamped_as_in_the_reference_but_keep_their_gradient():
    pe = kerple("power")
    with torch.no_grad():
        pe.bias_a.fill_(-1.0)  # used as 1e-2
        pe.bias_p.fill_(3.0)  # used as 2
    bias = pe.score_bias(Q, K, HEADS, 0)
    torch.testing.assert_close(bias[0, 10, 0], torch.tensor(-1e-2 * 10**2.0))
    bias.sum().backward()
    assert (pe.bias_a.grad[0] != 0).all() and (pe.bias_p.grad[0] != 0).all()  # straight through the clamp
    assert torch.isfinite(pe.bias_p.grad).all()  # 0^p at distance 0 has a finite gradient


def test_tables_are_not_weight_decayed_and_kernel_is_checked():
    pe = kerple("log")
    assert {id(p) for p in pe.no_weight_decay()} == {id(pe.bias_a), id(pe.bias_p)}
    with pytest.raises(PosGPTError, match="kernel"):
        SCHEMES["kerple"](KerpleConfig(kernel="gauss"), DIMS)
