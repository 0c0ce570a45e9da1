"""Each positional scheme's equation, checked directly."""

import math

import pytest
import torch
from omegaconf import OmegaConf
from reference_numbers import REFERENCE_NUMBERS

from core.errors import PosGPTError
from experiment.compose import compose_config
from experiment.settings import trained_config
from model.pe import SCHEMES, ModelDims
from model.pe.alibi import ALiBiConfig, alibi_slopes
from model.pe.hybrid import HybridPositionalEncoding as Pattern
from model.pe.learned import LearnedConfig
from model.pe.rope import RoPEConfig
from model.pe.sinusoidal import SinusoidalConfig, sinusoid_table

DIMS = ModelDims(n_embd=32, n_head=4, head_dim=8, train_seq_len=16, init_std=0.02)


def build(name, cfg, dims=DIMS):
    return SCHEMES[name](cfg, dims)


def test_registry_discovers_the_five_schemes():
    assert {"none", "sinusoidal", "learned", "rope", "alibi"} <= set(SCHEMES)


def test_sinusoid_equals_vaswani_formula():
    d = 16
    table = sinusoid_table(torch.arange(50), d)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            assert table[pos, 2 * i] == pytest.approx(math.sin(pos / 10000 ** (2 * i / d)), abs=1e-12)
            assert table[pos, 2 * i + 1] == pytest.approx(math.cos(pos / 10000 ** (2 * i / d)), abs=1e-12)


# The token signal under model.embedding=fairseq (model/gpt.py): N(0, d^-1/2) times sqrt(d).
FAIRSEQ_DIMS = ModelDims(
    n_embd=32, n_head=4, head_dim=8, train_seq_len=16, init_std=0.02, token_init_std=32**-0.5, token_scale=32**0.5
)


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


def test_registry_discovers_the_new_schemes():
    assert {"t5", "kerple", "fire", "xpos", "cope"} <= set(SCHEMES)


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


def test_rope_declares_scaling_and_remap_as_its_evaluation_time_settings():
    assert SCHEMES["rope"].eval_time_settings == SCHEMES["p_rope"].eval_time_settings == ("scaling", "remap")
    assert SCHEMES["scaled_nope"].eval_time_settings == ("score_scaling",)  # SWAN-GPT's switch (swan.py)
    own = ("rope", "p_rope", "scaled_nope")
    others = [name for name in SCHEMES if name not in own and not issubclass(SCHEMES[name], Pattern)]
    assert all(SCHEMES[name].eval_time_settings == () for name in others)  # patterns have their parts' (hybrid.py)


def test_eval_variations_are_declared_by_the_scheme():
    """What evaluation/run.py needs, without naming a scheme: the variants and a way to apply them."""
    from model.pe.rope_scaling import RoPEScalingConfig

    pe = build("rope", RoPEConfig())
    variations = pe.eval_variations(["none", "yarn:8", "yarn:8.0", "ntk:4"])
    assert [label for label, _ in variations] == ["", "yarn:8", "ntk:4"]  # no scaling: the run as trained
    q = torch.randn(1, 1, 4, DIMS.head_dim)
    before = pe.rotate(q, q, torch.arange(4), 4)[0]
    with pe.evaluated_with(variations[1][1]):
        assert pe.cfg.scaling == RoPEScalingConfig(type="yarn", factor=8.0)
        assert not torch.allclose(pe.rotate(q, q, torch.arange(4), 4)[0], before)
    assert pe.cfg.scaling.type == "none"
    assert pe.eval_variations([]) == [("", {"scaling": RoPEScalingConfig()})]
    alibi = build("alibi", ALiBiConfig())
    assert alibi.eval_variations([]) == [("", {})]
    with pytest.raises(PosGPTError, match="no evaluation-time variations"):
        alibi.eval_variations(["yarn:8"])
    with pytest.raises(PosGPTError, match="cannot change at evaluation time"):
        with pe.evaluated_with({"base": 500.0}):
            pass
