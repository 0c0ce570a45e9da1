"""RoPE scalings ``llama3`` and ``longrope`` (model/pe/rope_scaling.py): their equations checked directly, their
frequencies and attention factors through the module against Hugging Face's own (tests/support/reference), settings and
refusals, eval.variations, per-row randomized positions and train.init_from's original length.

Covered elsewhere through ROPE_SCALINGS: the reference numbers through the scaling functions
(test_rope_scaling.py) and cached decoding equal to a full forward with either type, for pe=rope and pe=p_rope,
past the training length (test_sample.py; longrope depends on the length, so a KV cache keeps keys unrotated).
"""

import math

import pytest
import torch
from cli_runs import TINY
from omegaconf import OmegaConf
from reference_numbers import REFERENCE_NUMBERS
from tiny_checkpoint import make_run

from core.errors import PosGPTError
from data.windows import random_positions
from experiment.build import build_model
from experiment.compose import compose_config
from experiment.config import Config, EvalConfig, validate
from experiment.plan import load_parent
from model import GPT, ModelConfig
from model.pe import ModelDims
from model.pe.rope import RoPEConfig, RotaryPositionalEncoding
from model.pe.rope_scaling import RoPEScalingConfig, parse_scaling, rope_inv_freq, scaling_label

BASE = 10000.0
SHORT = [1.0, 1.0, 1.1, 1.2, 1.3, 1.5, 1.7, 2.0]  # head_dim 16: one factor per pair
LONG = [1.0, 1.2, 1.6, 2.4, 3.5, 5.0, 8.0, 16.0]


def rope(scaling, head_dim=16, train_len=64, rotary_fraction=1.0, base=BASE):
    dims = ModelDims(n_embd=4 * head_dim, n_head=4, head_dim=head_dim, train_seq_len=train_len, init_std=0.02)
    return RotaryPositionalEncoding(RoPEConfig(base=base, rotary_fraction=rotary_fraction, scaling=scaling), dims)


def longrope(factor=16.0, **keys):
    return RoPEScalingConfig("longrope", factor, short_factor=SHORT, long_factor=LONG, **keys)


CASES = [case for case in REFERENCE_NUMBERS["rope_scaling"] if case["scaling"]["type"] in ("llama3", "longrope")]


def test_the_reference_covers_both_widths_llama_3_1_and_longrope_on_both_sides_of_l():
    names = " | ".join(case["name"] for case in CASES)
    for needed in ("llama3, d=16, L=64", "llama3, d=64, L=64", "Llama 3.1: d=128, base 5e5, L=8192, s=8, low 1, high"):
        assert needed in names
    longropes = [case for case in CASES if case["scaling"]["type"] == "longrope"]
    assert {case["seq_len"] > case["train_len"] for case in longropes} == {True, False}
    assert {"attention_factor" in case["scaling"] for case in longropes} == {True, False}
    assert {case["rotated_dims"] for case in longropes} >= {16, 64}


@pytest.mark.parametrize("case", CASES, ids=lambda case: case["name"])
def test_the_module_gives_hugging_faces_numbers_with_l_the_training_length(case):
    """Through RoPE's config: L = train.seq_len is original_max_position_embeddings, the number of keys seq_len."""
    fraction = case["hf"]["rope_parameters"]["partial_rotary_factor"]
    head_dim = round(case["rotated_dims"] / fraction)
    pe = rope(RoPEScalingConfig(**case["scaling"]), head_dim, case["train_len"], fraction, case["base"])
    inv_freq, attention_factor = pe.frequencies(case["seq_len"])
    torch.testing.assert_close(inv_freq, torch.tensor(case["inv_freq"], dtype=torch.float64), rtol=1e-6, atol=0.0)
    assert attention_factor == pytest.approx(case["attention_factor"], rel=1e-12)
    cos, _ = pe.cos_sin(torch.tensor([0, 1]), case["seq_len"])
    torch.testing.assert_close(cos[0].double(), torch.full_like(cos[0], attention_factor).double())


def test_llama3_keeps_short_wavelengths_divides_long_ones_and_ramps_between():
    """By wavelength lambda_i = 2 pi / theta_i: below L / high kept, above L / low divided by s, between a ramp
    linear in L / lambda_i (Hugging Face's smooth_factor)."""
    s, d, L, low, high = 16.0, 64, 64, 1.0, 4.0
    inv_freq, attention_factor = rope(RoPEScalingConfig("llama3", s), d, L).frequencies(L)
    theta = rope_inv_freq(d, BASE)
    regions = {"kept": 0, "divided": 0, "ramp": 0}
    for i, (got, original) in enumerate(zip(inv_freq.tolist(), theta.tolist())):
        wavelength = 2 * math.pi / original
        if wavelength < L / high:
            regions["kept"] += 1
            assert got == original, i
        elif wavelength > L / low:
            regions["divided"] += 1
            assert got == pytest.approx(original / s, rel=1e-12), i
        else:
            regions["ramp"] += 1
            smooth = (L / wavelength - low) / (high - low)
            assert got == pytest.approx((1 - smooth) * original / s + smooth * original, rel=1e-12), i
    assert min(regions.values()) >= 2 and attention_factor == 1.0
    # the same frequencies at any length: llama3 does not depend on it
    assert torch.equal(rope(RoPEScalingConfig("llama3", s), d, L).frequencies(16 * L)[0], inv_freq)


def test_llama3_frequency_factors_move_the_bands():
    default = rope(RoPEScalingConfig("llama3", 8.0), 64).frequencies(64)[0]
    explicit = rope(RoPEScalingConfig("llama3", 8.0, low_freq_factor=1.0, high_freq_factor=4.0), 64).frequencies(64)[0]
    wider = rope(RoPEScalingConfig("llama3", 8.0, low_freq_factor=0.5, high_freq_factor=16.0), 64).frequencies(64)[0]
    assert torch.equal(default, explicit) and not torch.equal(default, wider)


def test_longrope_divides_each_frequency_by_its_factor_short_up_to_l_long_beyond():
    s, L = 16.0, 64
    pe, theta = rope(longrope(s), 16, L), rope_inv_freq(16, BASE)
    expected_factor = math.sqrt(1 + math.log(s) / math.log(L))
    for seq_len, factors in [(1, SHORT), (L, SHORT), (L + 1, LONG), (16 * L, LONG)]:
        inv_freq, attention_factor = pe.frequencies(seq_len)
        torch.testing.assert_close(inv_freq, theta / torch.tensor(factors, dtype=torch.float64), rtol=1e-15, atol=0)
        assert attention_factor == pytest.approx(expected_factor, rel=1e-15)
    assert pe.rotation_depends_on_length() and not rope(RoPEScalingConfig("llama3", s)).rotation_depends_on_length()


def test_longrope_attention_factor_is_one_without_extension_or_as_set():
    assert rope(longrope(1.0)).frequencies(256)[1] == 1.0
    assert rope(longrope(16.0, attention_factor=1.25)).frequencies(256)[1] == 1.25
    ones = RoPEScalingConfig("longrope", 1.0, short_factor=[1.0] * 8, long_factor=[1.0] * 8)
    for seq_len in (64, 1024):  # all factors 1 and s = 1: RoPE
        assert torch.equal(rope(ones).frequencies(seq_len)[0], rope(RoPEScalingConfig()).frequencies(seq_len)[0])


@pytest.mark.parametrize(
    "scaling, message",
    [
        (RoPEScalingConfig("longrope", 4.0, short_factor=SHORT, long_factor=LONG[:-1]), "long_factor, a list of 8"),
        (RoPEScalingConfig("longrope", 4.0, long_factor=LONG), "short_factor, a list of 8 .* got none"),
        (
            RoPEScalingConfig("longrope", 4.0, short_factor=SHORT, long_factor=[0.0] * 8),
            r"long_factor\[0\]=0.0 is out of its domain \(0, inf\)",
        ),
        (RoPEScalingConfig("llama3", 4.0, short_factor=SHORT), "short_factor is a setting of type longrope, not"),
        (RoPEScalingConfig("yarn", 4.0, long_factor=LONG), "long_factor is a setting of type longrope, not yarn"),
        (longrope(4.0, low_freq_factor=2.0), "low_freq_factor is a setting of type llama3, not longrope"),
        (RoPEScalingConfig("ntk", 4.0, high_freq_factor=8.0), "high_freq_factor is a setting of type llama3, not ntk"),
        (RoPEScalingConfig("llama3", 4.0, attention_factor=1.0), "attention_factor .* yarn or longrope"),
        (RoPEScalingConfig("llama3", 4.0, low_freq_factor=4.0), "0 < low_freq_factor < high_freq_factor"),
    ],
)
def test_wrong_lists_and_settings_the_type_does_not_use_are_refused_in_one_line(scaling, message):
    with pytest.raises(PosGPTError, match=message) as error:
        rope(scaling)
    assert "\n" not in str(error.value)


def test_a_wrong_list_is_refused_when_the_model_is_built_from_the_config():
    overrides = ["pe=rope", "model.n_embd=32", "model.n_head=2", "pe.scaling.type=longrope", "pe.scaling.factor=4"]
    with pytest.raises(PosGPTError, match=r"pe.scaling: longrope needs short_factor, a list of 8 .* got 3"):
        build_model(compose_config([*overrides, "pe.scaling.short_factor=[1,1,1]", "pe.scaling.long_factor=[1,1,1]"]))


def test_eval_variations_take_each_types_settings_from_the_run():
    """Type none holds the settings for eval.variations' entries; each entry gets only those its type uses."""
    run = RoPEScalingConfig(low_freq_factor=2.0, short_factor=SHORT, long_factor=LONG, attention_factor=1.0)
    assert parse_scaling("longrope:8", run) == longrope(8.0, attention_factor=1.0)
    assert parse_scaling("llama3:8", run) == RoPEScalingConfig("llama3", 8.0, low_freq_factor=2.0)
    assert parse_scaling("ntk:8", run) == RoPEScalingConfig("ntk", 8.0)
    assert scaling_label(parse_scaling("llama3:8", run)) == "llama3:8(low_freq_factor=2,high_freq_factor=4)"
    assert scaling_label(RoPEScalingConfig("llama3", 8.0)) == "llama3:8"
    assert scaling_label(parse_scaling("longrope:8", run)) == "longrope:8(attention_factor=1)"
    pe = rope(run)
    variations = dict(pe.eval_variations(["llama3:8", "longrope:8"]))
    with pe.evaluated_with(variations["longrope:8(attention_factor=1)"]):
        assert pe.frequencies(128)[1] == 1.0 and pe.rotation_depends_on_length()
    for variations in (["llama3:8", "longrope:8"], ["longrope:8"]):
        config = OmegaConf.structured(Config(pe=RoPEConfig(scaling=run), eval=EvalConfig(variations=variations)))
        if "llama3:8" in variations:
            validate(config)
            continue
        with pytest.raises(PosGPTError, match="low_freq_factor=2.0 is read only when pe.scaling.type=llama3"):
            validate(config)  # no entry reads it: it would be ignored


def test_per_row_random_positions_equal_each_row_alone():
    head_dim_8 = RoPEScalingConfig("longrope", 4.0, short_factor=SHORT[:4], long_factor=LONG[:4])
    for scaling in (RoPEScalingConfig("llama3", 4.0), head_dim_8):
        torch.manual_seed(0)
        cfg = ModelConfig(n_layer=2, n_head=4, n_embd=32, vocab_size=300)
        model = GPT(cfg, RoPEConfig(scaling=scaling), train_seq_len=12)
        idx = torch.randint(0, 300, (3, 12))
        positions = random_positions(3, 12, 64, torch.Generator().manual_seed(1))
        together = model(idx, positions=positions)
        for b in range(3):
            torch.testing.assert_close(together[b : b + 1], model(idx[b : b + 1], positions=positions[b]))
        assert not torch.allclose(together, model(idx), atol=1e-4)


@pytest.mark.parametrize("scaling", [RoPEScalingConfig("llama3", 4.0), longrope(4.0)], ids=["llama3", "longrope"])
def test_an_extended_run_keeps_its_parents_frequencies(scaling):
    """Trained at 64, fine-tuned at 256 with original_seq_len = 64 (what train.init_from fills in): the parent's
    frequencies under the same scaling; with L = 256 they would differ (llama3's bands, longrope's switch)."""
    positions = torch.arange(512)
    parent = rope(scaling, train_len=64)
    child = rope(RoPEScalingConfig(**{**scaling.__dict__, "original_seq_len": 64}), train_len=256)
    forgetful = rope(scaling, train_len=256)
    for seq_len in (128, 512):
        for got, want in zip(child.cos_sin(positions, seq_len), parent.cos_sin(positions, seq_len)):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not torch.equal(forgetful.cos_sin(positions, 128)[0], parent.cos_sin(positions, 128)[0])


def test_init_from_fills_in_the_parents_length_for_llama3(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("unused: no data is read")
    parent_dir = make_run(tmp_path / "parent", corpus, "pe=rope")
    overrides = [*TINY, f"data.files=[{corpus}]", "pe=rope", f"train.init_from={parent_dir}", "train.seq_len=64"]
    cfg, parent = load_parent(compose_config([*overrides, "pe.scaling.type=llama3", "pe.scaling.factor=4"]))
    parent.load_into(build_model(cfg), cfg.train.seq_len)
    assert cfg.pe.scaling.original_seq_len == 16
