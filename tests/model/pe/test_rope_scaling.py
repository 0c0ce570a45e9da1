"""RoPE context extension: each method's equation, checked directly (see model/pe/rope_scaling.py), and its
frequencies against Hugging Face transformers' own (tests/support/reference_numbers.py)."""

import math

import pytest
import torch
from omegaconf import OmegaConf
from reference_numbers import REFERENCE_NUMBERS

from core.errors import PosGPTError
from experiment.config import Config, EvalConfig, validate
from model.pe import ModelDims
from model.pe.alibi import ALiBiConfig
from model.pe.rope import RoPEConfig, RotaryPositionalEncoding
from model.pe.rope_scaling import (
    ROPE_SCALINGS,
    RoPEScalingConfig,
    parse_scaling,
    rope_inv_freq,
    scaling_label,
    yarn_pair_index,
)

BASE = 10000.0


def scaled(kind, factor, head_dim=64, train_len=1024, seq_len=1024, **betas):
    cfg = RoPEScalingConfig(type=kind, factor=factor, **betas)
    return ROPE_SCALINGS[kind](rope_inv_freq(head_dim, BASE), cfg, BASE, head_dim, train_len, seq_len)


def rope(kind="none", factor=1.0, head_dim=8, train_len=16):
    dims = ModelDims(n_embd=4 * head_dim, n_head=4, head_dim=head_dim, train_seq_len=train_len, init_std=0.02)
    return RotaryPositionalEncoding(RoPEConfig(scaling=RoPEScalingConfig(kind, factor)), dims)


# longrope's per-pair factors are its settings: tests/model/pe/test_rope_scaling_llama3_longrope.py
@pytest.mark.parametrize("kind", sorted(set(ROPE_SCALINGS) - {"dynamic_ntk", "longrope"}))
def test_static_methods_with_factor_one_are_the_identity(kind):
    inv_freq, attention_factor = scaled(kind, 1.0, seq_len=4096)
    torch.testing.assert_close(inv_freq, rope_inv_freq(64, BASE))
    assert attention_factor == 1.0


def test_linear_at_position_s_m_equals_unscaled_at_m():
    s = 4
    plain, interpolated = rope(), rope("linear", s)
    q = torch.randn(1, 4, 5, 8)
    m = torch.tensor([0, 1, 3, 7, 15])
    torch.testing.assert_close(interpolated.rotate(q, q, s * m, 64)[0], plain.rotate(q, q, m, 16)[0])


def test_ntk_raises_the_base_so_the_slowest_frequency_is_divided_by_s():
    s, d = 8.0, 64
    inv_freq, attention_factor = scaled("ntk", s, head_dim=d)
    theta = rope_inv_freq(d, BASE)
    torch.testing.assert_close(inv_freq, rope_inv_freq(d, BASE * s ** (d / (d - 2))))
    assert inv_freq[0].item() == theta[0].item() == 1.0  # the fastest pair is untouched
    assert inv_freq[-1].item() == pytest.approx(theta[-1].item() / s, rel=1e-12)
    assert attention_factor == 1.0


def test_dynamic_ntk_is_unchanged_up_to_the_training_length_then_follows_the_length():
    s, d, L = 2.0, 64, 1024
    for seq_len in (1, L // 2, L):
        torch.testing.assert_close(scaled("dynamic_ntk", s, seq_len=seq_len)[0], rope_inv_freq(d, BASE))
    for k in (2, 4, 16):  # at k L the factor is s k - (s - 1); with s = 1, simply k
        torch.testing.assert_close(scaled("dynamic_ntk", s, seq_len=k * L)[0], scaled("ntk", s * k - (s - 1))[0])
        torch.testing.assert_close(scaled("dynamic_ntk", 1.0, seq_len=k * L)[0], scaled("ntk", k)[0])
    # through the module: seq_len is the number of keys, so a window no longer than L is not rescaled
    q = torch.randn(1, 4, 16, 8)
    torch.testing.assert_close(
        rope("dynamic_ntk", 4.0).rotate(q, q, torch.arange(16), 16)[0], rope().rotate(q, q, torch.arange(16), 16)[0]
    )


def test_yarn_pair_index_inverts_the_rotation_count():
    # pair i turns r_i = L theta_i / (2 pi) times over the training length L
    for r in (1.0, 32.0, 5.5):
        i = yarn_pair_index(r, 64, BASE, 1024)
        assert 1024 * BASE ** (-2 * i / 64) / (2 * math.pi) == pytest.approx(r)


def test_yarn_keeps_fast_pairs_interpolates_slow_ones_and_ramps_between():
    s, d, L = 8.0, 64, 1024
    inv_freq, attention_factor = scaled("yarn", s, head_dim=d, train_len=L)
    theta = rope_inv_freq(d, BASE)
    rotations = L * theta / (2 * math.pi)
    # pairs 0..5 turn >= 32 times over 1024 positions, pairs from 18 on turn < 1 time
    fast, slow = math.floor(yarn_pair_index(32, d, BASE, L)), math.ceil(yarn_pair_index(1, d, BASE, L))
    assert (fast, slow) == (5, 18)
    assert (rotations[: fast + 1] >= 32).all() and (rotations[slow:] < 1).all()
    torch.testing.assert_close(inv_freq[: fast + 1], theta[: fast + 1])  # highest frequencies untouched
    torch.testing.assert_close(inv_freq[slow:], theta[slow:] / s)  # lowest divided by s
    for i in range(fast + 1, slow):  # in between, a linear ramp over the pair index
        ramp = (i - fast) / (slow - fast)
        assert inv_freq[i].item() == pytest.approx(theta[i].item() * ((1 - ramp) + ramp / s), rel=1e-12)
    assert attention_factor == pytest.approx(0.1 * math.log(s) + 1)


def test_yarn_on_the_tiny_model_keeps_the_fastest_pair_and_divides_the_slowest():
    s = 16.0
    inv_freq, _ = scaled("yarn", s, head_dim=16, train_len=64)
    theta = rope_inv_freq(16, BASE)
    assert inv_freq[0].item() == theta[0].item()
    assert inv_freq[-1].item() == pytest.approx(theta[-1].item() / s)
    assert ((inv_freq <= theta) & (inv_freq >= theta / s - 1e-15)).all()


def test_yarn_temperature_scales_the_rotated_vectors():
    s = 8.0
    q = torch.randn(1, 4, 6, 8)
    rq, _ = rope("yarn", s).rotate(q, q, torch.arange(6), 6)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1) * (0.1 * math.log(s) + 1))


def test_yarn_attention_factor_replaces_the_temperature_and_nothing_else():
    default_freq, default_factor = scaled("yarn", 16.0, head_dim=64, train_len=64)
    inv_freq, factor = scaled("yarn", 16.0, head_dim=64, train_len=64, attention_factor=1.0)
    torch.testing.assert_close(inv_freq, default_freq)
    assert (factor, default_factor) == (1.0, pytest.approx(0.1 * math.log(16) + 1))
    # Only YaRN has a temperature: setting one elsewhere, or a non-positive one, is refused.
    for bad in [
        RoPEScalingConfig("ntk", 2.0, attention_factor=1.0),
        RoPEScalingConfig("yarn", 2.0, attention_factor=0.0),
    ]:
        with pytest.raises(PosGPTError, match="attention_factor"):
            rope().set_scaling(bad)


def test_set_scaling_changes_the_rotation_and_can_be_undone():
    pe, q = rope(), torch.randn(1, 4, 32, 8)
    before = pe.rotate(q, q, torch.arange(32), 32)[0]
    pe.set_scaling(RoPEScalingConfig("linear", 2.0))
    assert not torch.allclose(pe.rotate(q, q, torch.arange(32), 32)[0], before)
    pe.set_scaling(RoPEScalingConfig())
    torch.testing.assert_close(pe.rotate(q, q, torch.arange(32), 32)[0], before)


def test_scaling_specs_parse_and_label():
    assert parse_scaling("yarn:8") == RoPEScalingConfig("yarn", 8.0)
    assert parse_scaling("none") == RoPEScalingConfig()
    assert parse_scaling("yarn:4", RoPEScalingConfig(beta_fast=16.0)).beta_fast == 16.0
    assert scaling_label(RoPEScalingConfig("ntk", 8.0)) == "ntk:8"
    assert (
        scaling_label({"type": "yarn", "factor": 2.5, "beta_fast": 16.0, "beta_slow": 1.0})
        == "yarn:2.5(beta_fast=16,beta_slow=1)"
    )
    assert scaling_label(None) == ""
    # eval.variations take the run's yarn settings; the other types, which have no temperature, leave it out.
    untempered = RoPEScalingConfig(attention_factor=1.0)
    assert parse_scaling("yarn:16", untempered).attention_factor == 1.0
    assert parse_scaling("ntk:16", untempered).attention_factor is None
    assert parse_scaling("none", untempered) == RoPEScalingConfig()
    assert scaling_label(parse_scaling("yarn:16", untempered)) == "yarn:16(attention_factor=1)"
    for bad, message in [
        ("foo:2", "is not one of its choices"),
        ("yarn:x", "TYPE:FACTOR"),
        ("ntk:0.5", r"'ntk:0.5': factor=0.5 is out of its domain \[1, inf\)"),
        ("none:2", "no factor"),
    ]:
        with pytest.raises(PosGPTError, match=message):
            parse_scaling(bad)
    with pytest.raises(PosGPTError, match="beta_slow < beta_fast"):
        rope().set_scaling(RoPEScalingConfig("yarn", 2.0, beta_fast=1.0, beta_slow=2.0))


def eval_config(pe_cfg, **eval_keys):
    return OmegaConf.structured(Config(pe=pe_cfg, eval=EvalConfig(**eval_keys)))


def test_eval_variations_are_validated_with_the_config():
    validate(eval_config(RoPEConfig(), variations=["none", "yarn:8"]))
    with pytest.raises(PosGPTError, match="pe=alibi"):
        validate(eval_config(ALiBiConfig(), variations=["yarn:8"]))
    with pytest.raises(PosGPTError, match="not both"):
        validate(eval_config(RoPEConfig(scaling=RoPEScalingConfig("yarn", 2.0)), variations=["ntk:2"]))
    with pytest.raises(PosGPTError, match="is not one of its choices"):
        validate(eval_config(RoPEConfig(), variations=["bogus"]))
    # YaRN's temperature without YaRN would be ignored: refused
    untempered = RoPEConfig(scaling=RoPEScalingConfig(attention_factor=1.0))
    validate(eval_config(untempered, variations=["none", "yarn:16"]))
    for variations in [None, ["ntk:16"]]:
        with pytest.raises(PosGPTError, match=r"attention_factor=1.0 is read only when pe.scaling.type=yarn\|longrope"):
            validate(eval_config(untempered, variations=variations))


@pytest.mark.parametrize("case", REFERENCE_NUMBERS["rope_scaling"], ids=lambda case: case["name"])
def test_frequencies_and_attention_factor_equal_hugging_faces(case):
    # Hugging Face computes in float32; posgpt in float64, so they agree to float32's precision.
    d, base = case["rotated_dims"], case["base"]
    inv_freq, attention_factor = ROPE_SCALINGS[case["scaling"]["type"]](
        rope_inv_freq(d, base), RoPEScalingConfig(**case["scaling"]), base, d, case["train_len"], case["seq_len"]
    )
    torch.testing.assert_close(inv_freq, torch.tensor(case["inv_freq"], dtype=torch.float64), rtol=1e-6, atol=0.0)
    assert attention_factor == pytest.approx(case["attention_factor"], rel=1e-12)
