"""SWAN-GPT (model/pe/swan.py): the preset's pattern and window, the global layers' score scaling
s(n) = max(1, ln n / ln L) against its equation, switched and recorded as an evaluation-time setting; sliding-window
RoPE's refusals; and a tiny run through train.py and eval.py."""

from __future__ import annotations

import json
import math

import pytest
import torch
from omegaconf import OmegaConf

from core.errors import PosGPTError
from experiment.compose import compose_config
from experiment.config import validate
from model import GPT, KVCache, ModelConfig
from model.pe import SCHEMES, ModelDims, build_positional_encoding
from model.pe.rope_remap import parse_remap
from model.pe.rope_scaling import RoPEScalingConfig

VOCAB, L = 59, 16


def dims(train_seq_len: int = L) -> ModelDims:
    return ModelDims(n_embd=16, n_head=2, head_dim=8, train_seq_len=train_seq_len, init_std=0.02, n_layer=4)


def swan(**settings) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=4, n_head=2, n_embd=16, vocab_size=VOCAB, init_std=0.2)
    return GPT(cfg, SCHEMES["swan"].config_class(**settings), train_seq_len=L).eval()


def test_the_preset_is_three_windowed_rope_layers_to_one_global_nope_layer_with_a_window_of_l_over_8():
    cfg = OmegaConf.to_object(compose_config(["pe=swan"]).pe)
    assert cfg.pattern == ["swa_rope", "swa_rope", "swa_rope", "scaled_nope"]
    train_len = compose_config([]).train.seq_len
    assert cfg.swa_rope.window == train_len // 8 == 8 and cfg.scaled_nope.score_scaling is True
    lines = swan().describe_attention(torch.device("cpu"))
    assert lines == [*(f"layer {i}: swa_rope: sdpa, sliding window 8" for i in range(3)), "layer 3: scaled_nope: sdpa"]
    with pytest.raises(PosGPTError, match="use model.n_layer >= 4"):
        validate(compose_config(["pe=swan"]))


def test_the_score_scaling_is_its_equation():
    pe = build_positional_encoding(SCHEMES["scaled_nope"].config_class(), dims())
    q, k = torch.randn(2, 2, 40, 8), torch.randn(2, 2, 40, 8)
    positions = torch.arange(40)
    scaled_q, same_k = pe.rotate(q, k, positions, 40)
    s = torch.tensor([max(1.0, math.log(p + 1) / math.log(L)) for p in range(40)])
    torch.testing.assert_close(scaled_q, q * s[:, None])
    assert same_k is k
    assert torch.equal(scaled_q[..., :L, :], q[..., :L, :])  # exactly 1 up to L
    rows = torch.stack([positions, positions + 5])  # positions per row
    per_row = torch.tensor([[max(1.0, math.log(p + 1) / math.log(L)) for p in row] for row in rows.tolist()])
    torch.testing.assert_close(pe.rotate(q, k, rows, 45)[0], q * per_row[:, None, :, None])


@torch.no_grad()
def test_within_the_training_length_the_model_is_nope_and_beyond_it_the_switch_tells():
    scaled = swan()
    plain = swan(scaled_nope=SCHEMES["scaled_nope"].config_class(score_scaling=False))
    plain.load_state_dict(scaled.state_dict())
    idx = torch.randint(0, VOCAB, (2, 3 * L), generator=torch.Generator().manual_seed(1))
    assert torch.equal(scaled(idx[:, :L]), plain(idx[:, :L]))
    assert not torch.allclose(scaled(idx)[:, L:], plain(idx)[:, L:])
    pe = scaled.pe
    ((label, settings),) = pe.eval_variations(["score_scaling:off"])
    assert label == "no score scaling" and settings == {"scaled_nope.score_scaling": False}
    with pe.evaluated_with(settings):
        torch.testing.assert_close(scaled(idx), plain(idx))
    assert pe.settings() == {"scaled_nope.score_scaling": True}  # what rows record
    assert pe.current_variation() == ""
    labels = [label for label, _ in pe.eval_variations(["score_scaling:on", "score_scaling:off"])]
    assert labels == ["", "no score scaling"]
    cache = KVCache()  # decoding counts the cached keys: the same scale as a full forward
    steps = [scaled(idx[:, :5], cache=cache)] + [scaled(idx[:, t : t + 1], cache=cache) for t in range(5, 3 * L)]
    torch.testing.assert_close(torch.cat(steps, dim=1), scaled(idx), rtol=1e-4, atol=1e-4)


def test_refusals():
    with pytest.raises(PosGPTError, match="no scheme of pe=swan's pattern"):
        swan().pe.eval_variations(["yarn:2"])
    with pytest.raises(PosGPTError, match="score_scaling:on or score_scaling:off"):
        SCHEMES["scaled_nope"].parse_variation("score_scaling:maybe", SCHEMES["scaled_nope"].config_class())
    window = SCHEMES["swa_rope"].config_class
    for cfg in (window(scaling=RoPEScalingConfig(type="yarn", factor=2.0)), window(remap=parse_remap("rerope:4"))):
        with pytest.raises(PosGPTError, match="has no distance to extend"):
            build_positional_encoding(cfg, dims())
    with pytest.raises(PosGPTError, match="no distance to extend"):
        SCHEMES["swa_rope"].check_variations(window(), ["yarn:2"])
    with pytest.raises(PosGPTError, match="train with pe.score_scaling=false"):
        swan().pe.check_random_positions(64)
    swan(scaled_nope=SCHEMES["scaled_nope"].config_class(score_scaling=False)).pe.check_random_positions(64)
    with pytest.raises(PosGPTError, match="ln\\(train.seq_len\\)"):
        SCHEMES["scaled_nope"].check_model(SCHEMES["scaled_nope"].config_class(), dims(train_seq_len=1))


# --- Through the CLI: a tiny SWAN run, trained and evaluated at 2x with and without the score scaling ---

SWAN = ["pe=swan", "model.n_layer=4", "pe.swa_rope.window=2", "train.max_steps=3"]  # window L/8 at L = 16
EVAL = ["eval.max_tokens=64", "eval.length_multipliers=[1,2]", "eval.protocols=[nonoverlapping]"]


@pytest.mark.slow
def test_a_tiny_swan_run_trains_and_its_rows_record_the_scaling(cli):
    run_dir = cli.base / "swan"
    done = cli.train_here(run_dir, *SWAN)
    assert done.returncode == 0, done.stderr
    assert "train: pe=swan[swa_rope,swa_rope,swa_rope,scaled_nope] " in done.stdout
    assert "train: layer 0: swa_rope: sdpa, sliding window 2" in done.stdout
    evaluated = cli.eval_here(run_dir, "eval.variations=[score_scaling:on,score_scaling:off]", *EVAL)
    assert evaluated.returncode == 0, evaluated.stderr
    rows = json.loads((run_dir / "eval" / "extrapolation.json").read_text())["results"]
    by = {(row["variation"], row["length"]): row for row in rows}
    assert {row["variation"] for row in rows} == {"", "no score scaling"}
    for (variation, _), row in by.items():
        assert row["variation_settings"] == {"scaled_nope.score_scaling": variation == ""}
    assert by[("", 16)]["ppl"] == by[("no score scaling", 16)]["ppl"]  # s = 1 up to L
    assert by[("", 32)]["ppl"] != by[("no score scaling", 32)]["ppl"]
    off = cli.eval_here(run_dir, "pe.scaled_nope.score_scaling=false", *EVAL)
    assert off.returncode == 0, off.stderr
