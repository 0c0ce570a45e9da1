"""The sinusoidal scheme (model/pe/sinusoidal.py): the sinusoid against Vaswani et al.'s formula, the paper's
unscaled vectors by default, the remedy that matches the token signal's RMS, and old checkpoints as trained."""

import math

import pytest
import torch
from omegaconf import OmegaConf
from pe_schemes import DIMS, FAIRSEQ_DIMS, build

from experiment.compose import compose_config
from experiment.settings import trained_config
from model.pe.sinusoidal import SinusoidalConfig, sinusoid_table


def test_sinusoid_equals_vaswani_formula():
    d = 16
    table = sinusoid_table(torch.arange(50), d)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            assert table[pos, 2 * i] == pytest.approx(math.sin(pos / 10000 ** (2 * i / d)), abs=1e-12)
            assert table[pos, 2 * i + 1] == pytest.approx(math.cos(pos / 10000 ** (2 * i / d)), abs=1e-12)


def test_sinusoidal_default_is_the_papers_unscaled_vectors():
    """Under the default token convention (fairseq's); under GPT-2's, pe.match_tokens scales them (below)."""
    positions = torch.arange(4096)
    vectors = build("sinusoidal", SinusoidalConfig(), FAIRSEQ_DIMS).embed(positions)
    torch.testing.assert_close(vectors, sinusoid_table(positions, FAIRSEQ_DIMS.n_embd).float(), rtol=0, atol=0)
    assert vectors.abs().max().item() == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("dims, token_rms", [(DIMS, 0.02), (FAIRSEQ_DIMS, 1.0)], ids=["gpt2", "fairseq"])
def test_sinusoidal_remedy_matches_the_token_signal_rms(dims, token_rms):
    """pe.scale=null: the sinusoid gets the RMS of the token signal at initialisation, under either convention."""
    assert dims.token_rms == pytest.approx(token_rms)
    vectors = build("sinusoidal", SinusoidalConfig(scale=None), dims).embed(torch.arange(4096))
    assert vectors.pow(2).mean().sqrt().item() == pytest.approx(token_rms, rel=0.02)


@pytest.mark.parametrize("dims, expected_rms", [(DIMS, 0.02), (FAIRSEQ_DIMS, 2**-0.5)], ids=["gpt2", "fairseq"])
def test_sinusoidal_match_tokens_applies_the_remedy_under_gpt2_only(dims, expected_rms):
    """pe.match_tokens=true (the default): the paper's vectors under fairseq's convention, the token-RMS remedy
    under GPT-2's, whatever pe.scale says; false: pe.scale under both."""
    vectors = build("sinusoidal", SinusoidalConfig(scale=1.0), dims).embed(torch.arange(4096))
    assert vectors.pow(2).mean().sqrt().item() == pytest.approx(expected_rms, rel=0.02)
    as_given = build("sinusoidal", SinusoidalConfig(scale=1.0, match_tokens=False), dims).embed(torch.arange(4096))
    assert as_given.pow(2).mean().sqrt().item() == pytest.approx(2**-0.5, rel=0.02)


def test_sinusoidal_checkpoints_without_match_tokens_build_as_trained():
    """A checkpoint written before pe.match_tokens existed gets false (LEGACY_VALUES): its scale, as trained; a
    scheme without the key gets none."""
    saved = OmegaConf.to_container(compose_config(["pe=sinusoidal", "model.embedding=gpt2"]), resolve=True)
    assert saved["pe"].pop("match_tokens") is True  # the YAML default of new runs
    assert trained_config(saved).pe.match_tokens is False
    rope = OmegaConf.to_container(compose_config(["pe=rope"]), resolve=True)
    assert "match_tokens" not in trained_config(rope).pe


def test_sinusoidal_is_defined_far_beyond_training_length():
    pe = build("sinusoidal", SinusoidalConfig())
    assert pe.max_positions() is None and pe.beyond_reach(100_000) is None
    assert torch.isfinite(pe.embed(torch.arange(100_000, 100_010))).all()
