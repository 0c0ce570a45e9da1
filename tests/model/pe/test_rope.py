"""RoPE (model/pe/rope.py): norms kept, scores that depend on the offset alone, the pairwise rotation of Su et al.,
the refusal of an odd head dimension, and the partial rotary fraction with its own frequencies and scalings."""

import math

import pytest
import torch
from pe_schemes import DIMS, build

from core.errors import PosGPTError
from model.pe import ModelDims
from model.pe.rope import RoPEConfig


def random_qk(T=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, DIMS.n_head, T, DIMS.head_dim, generator=g), torch.randn(
        2, DIMS.n_head, T, DIMS.head_dim, generator=g
    )


def test_rope_preserves_norms_and_leaves_position_zero_unchanged():
    pe = build("rope", RoPEConfig())
    q, k = random_qk()
    rq, rk = pe.rotate(q, k, torch.arange(q.shape[2]), q.shape[2])
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    torch.testing.assert_close(rk.norm(dim=-1), k.norm(dim=-1))
    torch.testing.assert_close(rq[:, :, 0], q[:, :, 0])


def test_rope_dot_product_depends_only_on_offset():
    pe = build("rope", RoPEConfig())
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 1, 1, DIMS.head_dim, generator=g)
    k = torch.randn(1, 1, 1, DIMS.head_dim, generator=g)

    def score(m, n):
        rq, _ = pe.rotate(q, q, torch.tensor([m]), 1)
        rk, _ = pe.rotate(k, k, torch.tensor([n]), 1)
        return (rq * rk).sum().item()

    for m, n in [(5, 2), (9, 9), (3, 11)]:
        for shift in (1, 17, 1000):
            assert score(m + shift, n + shift) == pytest.approx(score(m, n), abs=1e-4)
    assert score(5, 2) != pytest.approx(score(6, 2), abs=1e-4)  # and it does depend on the offset


def test_rope_rotation_matches_su_et_al_pairwise_rotation():
    """Coordinates (i, i + d/2) are rotated by angle m * base^(-2i/d)."""
    pe = build("rope", RoPEConfig(base=100.0))
    d, m = DIMS.head_dim, 7
    x = torch.randn(1, 1, 1, d, dtype=torch.float64).float()
    rx, _ = pe.rotate(x, x, torch.tensor([m]), 1)
    for i in range(d // 2):
        angle = m * 100.0 ** (-2 * i / d)
        a, b = x[0, 0, 0, i].item(), x[0, 0, 0, i + d // 2].item()
        assert rx[0, 0, 0, i].item() == pytest.approx(a * math.cos(angle) - b * math.sin(angle), abs=1e-5)
        assert rx[0, 0, 0, i + d // 2].item() == pytest.approx(a * math.sin(angle) + b * math.cos(angle), abs=1e-5)


def test_rope_rejects_odd_head_dimension():
    with pytest.raises(PosGPTError, match="even"):
        build("rope", RoPEConfig(), ModelDims(n_embd=15, n_head=5, head_dim=3, train_seq_len=8, init_std=0.02))


def test_partial_rotary_rotates_only_the_first_fraction_with_its_own_frequencies():
    """rotary_fraction 0.5 of head_dim 8: coordinates 0..3 rotated as a 4-dim RoPE (pairs (0, 2), (1, 3)),
    coordinates 4..7 unchanged (GPT-NeoX rotary_pct)."""
    pe = build("rope", RoPEConfig(base=100.0, rotary_fraction=0.5))
    x = torch.randn(1, 1, 1, DIMS.head_dim)
    m, r = 5, 4
    rx, _ = pe.rotate(x, x, torch.tensor([m]), 1)
    torch.testing.assert_close(rx[..., r:], x[..., r:])
    for i in range(r // 2):
        angle = m * 100.0 ** (-2 * i / r)
        a, b = x[0, 0, 0, i].item(), x[0, 0, 0, i + r // 2].item()
        assert rx[0, 0, 0, i].item() == pytest.approx(a * math.cos(angle) - b * math.sin(angle), abs=1e-5)
        assert rx[0, 0, 0, i + r // 2].item() == pytest.approx(a * math.sin(angle) + b * math.cos(angle), abs=1e-5)


def test_partial_rotary_keeps_the_scalings_working():
    from model.pe.rope_scaling import RoPEScalingConfig

    x = torch.randn(1, 1, 6, DIMS.head_dim)
    plain = build("rope", RoPEConfig(rotary_fraction=0.5))
    linear = build("rope", RoPEConfig(rotary_fraction=0.5, scaling=RoPEScalingConfig(type="linear", factor=4.0)))
    # linear scaling at position 4m is the plain rotation at m, on the rotated part; the rest untouched
    plain_out = plain.rotate(x, x, torch.arange(6), 6)[0]
    torch.testing.assert_close(linear.rotate(x, x, 4 * torch.arange(6), 24)[0], plain_out)
    yarn = build("rope", RoPEConfig(rotary_fraction=0.5, scaling=RoPEScalingConfig(type="yarn", factor=4.0)))
    out = yarn.rotate(x, x, torch.arange(6), 6)[0]
    assert torch.isfinite(out).all() and not torch.allclose(out[..., :4], plain_out[..., :4])


@pytest.mark.parametrize("fraction", [0.0, 1.5, 0.125, 0.375])
def test_partial_rotary_refuses_fractions_without_whole_pairs(fraction):
    with pytest.raises(PosGPTError, match="rotary_fraction"):
        build("rope", RoPEConfig(rotary_fraction=fraction))
