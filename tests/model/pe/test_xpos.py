"""xPos: zeta as in the reference code, the decayed relative score, and no overflow at 16K positions."""

import math

import pytest
import torch
from reference_numbers import REFERENCE_NUMBERS

from model.pe import SCHEMES, ModelDims
from model.pe.rope import RoPEConfig
from model.pe.xpos import XPosConfig, xpos_zeta

D = 8
DIMS = ModelDims(n_embd=4 * D, n_head=4, head_dim=D, train_seq_len=16, init_std=0.02)


def test_zeta_matches_torchscale():
    # microsoft/torchscale XPOS: scale = (arange(0, head_dim, 2) + 0.4 * head_dim) / (1.4 * head_dim)
    expected = [(2 * i + 0.4 * D) / (1.4 * D) for i in range(D // 2)]
    assert xpos_zeta(D).tolist() == pytest.approx(expected)
    assert expected[0] == pytest.approx(0.4 / 1.4)


@pytest.mark.parametrize(
    "case", REFERENCE_NUMBERS["xpos_scores"], ids=lambda case: f"from position {case['first_position']}"
)
def test_scores_equal_torchscales(case):
    """Every score q'_n . k'_m of a sequence equals microsoft/torchscale's XPOS (the paper's code), whose pair i is
    coordinates 2i, 2i + 1 where posgpt's is i, i + d/2: the same vectors, reordered."""
    d, q, k = case["head_dim"], torch.tensor(case["q"]), torch.tensor(case["k"])
    length = q.shape[0]
    ours_from_theirs = torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))
    dims = ModelDims(n_embd=4 * d, n_head=4, head_dim=d, train_seq_len=16, init_std=0.02)
    positions = torch.arange(case["first_position"], case["first_position"] + length)
    rq, rk = SCHEMES["xpos"](XPosConfig(), dims).rotate(
        q[:, ours_from_theirs].view(1, 1, length, d), k[:, ours_from_theirs].view(1, 1, length, d), positions, length
    )
    # torchscale computes the angles in float32 (5000 x float32's 6e-8: ~3e-4 rad there); posgpt in float64
    tolerance = 1e-5 if case["first_position"] == 0 else 2e-3
    torch.testing.assert_close(
        rq[0, 0].double() @ rk[0, 0].double().T,
        torch.tensor(case["scores"], dtype=torch.float64),
        rtol=0.0,
        atol=tolerance,
    )


def score(pe, q, k, n, m, centre_positions):
    """q at position n and k at position m, rotated in one forward pass whose positions are centre_positions."""
    positions = torch.tensor(centre_positions)
    prepared = pe.prepare(positions, len(centre_positions), {})
    qs, ks = pe.rotate(
        q.expand(1, 1, len(centre_positions), D),
        k.expand(1, 1, len(centre_positions), D),
        positions,
        len(centre_positions),
        prepared,
    )
    return (qs[0, 0, centre_positions.index(n)].double() * ks[0, 0, centre_positions.index(m)].double()).sum().item()


@pytest.mark.parametrize("n, m", [(7, 3), (16_384, 16_000), (16_384, 0)])
def test_score_is_rope_score_decayed_per_pair(n, m):
    """q'_n . k'_m = sum_i zeta_i^((n-m)/gamma) x (pair i's part of RoPE's score), even at 16K positions."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(D, generator=g), torch.randn(D, generator=g)
    xpos = SCHEMES["xpos"](XPosConfig(), DIMS)
    rope = SCHEMES["rope"](RoPEConfig(), DIMS)
    rq, _ = rope.rotate(q.view(1, 1, 1, D), q.view(1, 1, 1, D), torch.tensor([n]), 1)
    rk, _ = rope.rotate(k.view(1, 1, 1, D), k.view(1, 1, 1, D), torch.tensor([m]), 1)
    per_coordinate = (rq * rk).view(D).double()
    zeta = torch.cat((xpos_zeta(D), xpos_zeta(D)))  # pairs (i, i + D/2)
    want = (per_coordinate * zeta ** ((n - m) / 512)).sum().item()
    got = score(xpos, q, k, n, m, list(range(m, n + 1)) if n - m < 1000 else [m, n])
    assert math.isfinite(got)
    assert got == pytest.approx(want, rel=1e-3, abs=1e-6)


def test_positions_far_beyond_gamma_stay_finite_in_bfloat16_and_float32():
    xpos = SCHEMES["xpos"](XPosConfig(), DIMS)
    positions = torch.arange(16_384)
    for t in xpos.prepare(positions, positions.numel(), {}):
        assert torch.isfinite(t).all()
        assert torch.isfinite(t.to(torch.bfloat16)).all()
        assert t.abs().max() < 1e10  # centred: at most e^(1.25 * 16) rather than e^(1.25 * 32)
