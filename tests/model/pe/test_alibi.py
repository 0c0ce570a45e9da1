"""ALiBi (model/pe/alibi.py): the slopes against Hugging Face's and the paper's, and a bias linear in distance."""

import pytest
import torch
from pe_schemes import DIMS, build
from reference_numbers import REFERENCE_NUMBERS

from model.pe.alibi import ALiBiConfig, alibi_slopes


def test_alibi_slopes_equal_hugging_faces():
    # BLOOM's build_alibi_tensor (transformers), which follows Press et al.'s get_slopes, for 1 to 32 heads
    for n_head, slopes in REFERENCE_NUMBERS["alibi_slopes"].items():
        assert alibi_slopes(int(n_head)) == pytest.approx(slopes, rel=1e-6)


def test_alibi_slopes_match_the_paper():
    assert alibi_slopes(8) == pytest.approx([1 / 2**i for i in range(1, 9)])
    # 12 heads: the 8 slopes of n=8, then every other slope of n=16 (2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5).
    expected_12 = [2**-i for i in range(1, 9)] + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]
    assert alibi_slopes(12) == pytest.approx(expected_12)
    assert alibi_slopes(16)[0] == pytest.approx(2**-0.5)


def test_alibi_bias_is_linear_in_distance_per_head():
    pe = build("alibi", ALiBiConfig())
    q_pos, k_pos = torch.arange(10)[:, None], torch.arange(10)[None, :]
    heads = torch.arange(DIMS.n_head)[:, None, None]
    bias = pe.score_bias(q_pos, k_pos, heads, 0)
    slopes = torch.tensor(alibi_slopes(DIMS.n_head))
    distance = (q_pos - k_pos).float()
    torch.testing.assert_close(bias, -slopes[:, None, None] * distance)
    # depends on distance only, not on absolute position
    torch.testing.assert_close(pe.score_bias(q_pos + 100, k_pos + 100, heads, 0), bias)
