"""The length-dependent attention temperature (model/temperature.py): its factors against hand-computed values,
every attention path equal, the KV cache, randomized positions, off by default, config refusals, DroPE's
per-window temperature (against the reference's form: one scale of the logits), and tiny train + eval runs."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from cli_runs import assert_one_line_error

from core.errors import PosGPTError
from model import GPT, ModelConfig
from model.pe import SCHEMES
from model.temperature import (
    AttentionTemperature,
    TemperatureConfig,
    check_evaluation_change,
    temperature_label,
    temperature_settings,
)

TYPES = ("logn", "llama4", "ssmax")


def tiny(pe: str = "rope", layers: int = 2, **temperature) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(
        n_layer=layers, n_head=2, n_embd=32, vocab_size=64, attn_temperature=TemperatureConfig(**temperature)
    )
    return GPT(cfg, SCHEMES[pe].config_class(), train_seq_len=8)


def test_factors_are_the_papers_equations_by_hand():
    n_head, L = 2, 8
    logn = AttentionTemperature(TemperatureConfig(type="logn"), n_head, L).factors(0, 16, torch.device("cpu"))
    assert torch.allclose(logn[:8], torch.ones(8))  # max(1, log n / log L): 1 up to the training length
    assert logn[15].item() == pytest.approx(math.log(16) / math.log(8))  # n = 16: 4/3
    llama = AttentionTemperature(TemperatureConfig(type="llama4", floor_scale=4, attn_scale=0.1), n_head, L)
    tau = llama.factors(0, 12, torch.device("cpu"))  # n = 1 .. 12
    expected = [1.0] * 3 + [1 + 0.1 * math.log(2)] * 4 + [1 + 0.1 * math.log(3)] * 4 + [1 + 0.1 * math.log(4)]
    assert tau.tolist() == pytest.approx(expected)
    # Llama 4's own expression (transformers modeling_llama4.py) at cache_position = n - 1
    cache_position = torch.arange(12).float()
    assert torch.allclose(tau, torch.log(torch.floor((cache_position + 1.0) / 4) + 1.0) * 0.1 + 1.0)
    ssmax = AttentionTemperature(TemperatureConfig(type="ssmax"), n_head, L)
    tau = ssmax.factors(5, 3, torch.device("cpu"))  # queries 5, 6, 7 of 8 keys: n = 6, 7, 8
    assert tau.shape == (n_head, 3)
    assert tau[:, -1].tolist() == pytest.approx([1.0, 1.0])  # s = 1 / log L at initialisation: tau(L) = 1
    assert tau[0, 0].item() == pytest.approx(math.log(6) / math.log(8))


def test_a_scale_of_q_is_a_per_row_scale_of_the_logits():
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    tau = torch.linspace(1.0, 2.0, 6)
    scores = (q @ k.transpose(-1, -2)) / 2.0 * tau[:, None]
    scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    expected = torch.softmax(scores, -1) @ v
    assert torch.allclose(F.scaled_dot_product_attention(q * tau[:, None], k, v, is_causal=True), expected, atol=1e-6)


@pytest.mark.parametrize("pe", ["rope", "alibi"])
@pytest.mark.parametrize("kind", [*TYPES, "drope"])
def test_every_backend_computes_the_same(pe, kind):
    model = tiny(pe, type=kind, floor_scale=4)
    x = torch.randint(0, 64, (2, 20))
    outputs = {}
    for backend in ("sdpa", "math", "flex"):
        for block in model.blocks:
            block.attn.backend = backend
        with torch.no_grad():
            outputs[backend] = model(x)
    assert torch.allclose(outputs["sdpa"], outputs["math"], atol=1e-5)
    assert torch.allclose(outputs["flex"], outputs["math"], atol=1e-5)
    with torch.no_grad():
        assert (outputs["math"] - tiny(pe)(x)).abs().max() > 1e-6  # the temperature changes something


@pytest.mark.parametrize("kind", TYPES)
def test_the_kv_cache_gives_the_full_forward_logits(kind):
    from model.gpt import KVCache

    model = tiny(type=kind, floor_scale=4).eval()
    x = torch.randint(0, 64, (1, 14))
    with torch.no_grad():
        full = model(x)
        cache = KVCache()
        steps = [model(x[:, :5], cache=cache)] + [model(x[:, t : t + 1], cache=cache) for t in range(5, 14)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


def test_randomized_positions_count_keys_not_position_labels():
    """With explicit positions the factor follows the number of keys attended (the index), so the written-out and
    sdpa paths agree and a shift of every position changes nothing for a relative scheme."""
    model = tiny(type="logn").eval()
    x = torch.randint(0, 64, (2, 12))
    positions = torch.sort(torch.randperm(40)[:12]).values
    with torch.no_grad():
        shifted = model(x, positions=positions + 100)
        assert torch.allclose(model(x, positions=positions), shifted, atol=1e-4)
        for block in model.blocks:
            block.attn.backend = "math"
        assert torch.allclose(model(x, positions=positions), shifted, atol=1e-4)


def test_off_by_default_leaves_the_model_as_it_was():
    model = tiny()
    q = torch.randn(1, 2, 5, 16)
    assert model.blocks[0].attn.temperature(q, 0) is q  # not even a multiplication by 1
    assert not [name for name in model.state_dict() if "temperature" in name or "sink" in name]
    ssmax = tiny(type="ssmax")
    assert [name for name in ssmax.state_dict() if "temperature" in name] == [
        "blocks.0.attn.temperature.s",
        "blocks.1.attn.temperature.s",
    ]
    assert torch.allclose(ssmax.blocks[0].attn.temperature.s, torch.full((2,), 1 / math.log(8)))  # not re-initialised


def test_gradients_reach_ssmax_s():
    model = tiny(type="ssmax")
    x = torch.randint(0, 64, (2, 10))
    model(x, x).backward()
    assert model.blocks[0].attn.temperature.s.grad.abs().sum() > 0


def test_refusals():
    with pytest.raises(PosGPTError, match="model.attn_temperature.type='warm' is not one of its choices"):
        tiny(type="warm")
    with pytest.raises(PosGPTError, match="divides by log"):
        AttentionTemperature(TemperatureConfig(type="logn"), 2, 1)
    with pytest.raises(PosGPTError, match="learns its parameters in training"):
        check_evaluation_change(TemperatureConfig(), TemperatureConfig(type="ssmax"))
    with pytest.raises(PosGPTError, match="learns its parameters in training"):
        check_evaluation_change(TemperatureConfig(type="ssmax"), TemperatureConfig(type="logn"))
    check_evaluation_change(TemperatureConfig(), TemperatureConfig(type="llama4"))  # parameter-free: allowed
    check_evaluation_change(TemperatureConfig(), TemperatureConfig(type="drope", c=0.3))


def test_drope_is_one_factor_for_the_window_from_its_extension_held_at_1_within_l():
    """beta = 1 + c ln s, s = the window's keys / L, the same for every query of the window; 1 (no scale at all)
    for s <= 1."""
    cpu = torch.device("cpu")
    drope = AttentionTemperature(TemperatureConfig(type="drope", c=0.25), 2, 8)
    assert drope.factors(0, 8, cpu) is None and drope.factors(0, 5, cpu) is None  # s = 1, s < 1: not below 1
    tau = drope.factors(0, 32, cpu)  # a window of 4L: every query, the first one too, takes s = 4
    assert tau.shape == (32,) and torch.allclose(tau, torch.full((32,), 1 + 0.25 * math.log(4)))
    assert drope.factors(24, 8, cpu).tolist() == pytest.approx([1 + 0.25 * math.log(4)] * 8)  # 24 keys cached
    assert drope.factors(8, 1, cpu).tolist() == pytest.approx([1 + 0.25 * math.log(9 / 8)])
    q = torch.randn(1, 2, 5, 16)
    assert drope(q, 0) is q  # within L the run is its model as trained, bit for bit
    settings = temperature_settings(TemperatureConfig(type="drope", c=0.25))
    assert settings == {"type": "drope", "c": 0.25} and temperature_label(settings) == "drope(c=0.25)"
    assert temperature_settings({"type": "drope", "floor_scale": None, "attn_scale": 0.1, "c": 0.1})["c"] == 0.1


def test_drope_multiplies_every_logit_of_the_window_by_one_beta_as_the_references_softmax_scale():
    """The reference's hook sets the attention's scaling of q . k to one number: beta / sqrt(d) is the model with
    its query projection times beta. A NoPE model with the drope temperature equals that model without one."""
    torch.manual_seed(3)
    T, L, c = 40, 8, 0.3
    beta = 1 + c * math.log(T / L)
    with_temperature = tiny("none", type="drope", c=c).eval()
    scaled = tiny("none").eval()
    scaled.load_state_dict(with_temperature.state_dict())
    C = scaled.cfg.n_embd
    with torch.no_grad():
        for block in scaled.blocks:
            block.attn.qkv.weight[:C] *= beta
            block.attn.qkv.bias[:C] *= beta
        x = torch.randint(0, 64, (2, T))
        torch.testing.assert_close(with_temperature(x), scaled(x), rtol=1e-5, atol=1e-5)
        assert (with_temperature(x) - tiny("none")(x)).abs().max() > 1e-4


def test_drope_with_a_kv_cache_takes_the_length_so_far_at_each_step():
    """One layer: a cached step's logits are the last position's of a full forward of the tokens so far (both
    take s of the keys so far). Two layers: the earlier tokens' hidden states were computed at their own lengths,
    so step-by-step decoding is not the full forward of the whole window (the module docstring)."""
    from model.gpt import KVCache

    x = torch.randint(0, 64, (1, 20))
    for layers in (1, 2):
        model = tiny("none", layers, type="drope", c=1.0).eval()
        with torch.no_grad():
            for block in model.blocks:  # sharper attention than at initialisation, where beta changes little
                block.attn.qkv.weight.mul_(30)
            cache = KVCache()
            model(x[:, :4], cache=cache)
            steps = [model(x[:, t : t + 1], cache=cache)[:, -1] for t in range(4, 20)]
            prefixes = [model(x[:, : t + 1])[:, -1] for t in range(4, 20)]
        gap = max((step - prefix).abs().max().item() for step, prefix in zip(steps, prefixes))
        assert gap < 1e-5 if layers == 1 else gap > 1e-3, (layers, gap)


@pytest.mark.slow
def test_train_with_ssmax_and_evaluate_a_plain_run_with_logn(cli, reference, tmp_path):
    run = tmp_path / "ssmax"
    done = cli.train_here(run, "train.max_steps=3", "pe=rope", "model.attn_temperature.type=ssmax")
    assert done.returncode == 0, done.stderr
    refused = cli.eval_here(run, "model.attn_temperature.type=logn")
    assert_one_line_error(refused, "learns its parameters in training")
    done = cli.eval_here(run, "eval.length_multipliers=[1,2]", "eval.protocols=[nonoverlapping]")
    assert done.returncode == 0, done.stderr
    # a run trained without: evaluated with logn, rows recorded apart from the plain ones
    plain = tmp_path / "plain"
    import shutil

    shutil.copytree(reference, plain)
    for extra in ([], ["model.attn_temperature.type=logn"]):
        done = cli.eval_here(plain, "eval.length_multipliers=[1,2]", "eval.protocols=[nonoverlapping]", *extra)
        assert done.returncode == 0, done.stderr
    rows = json.loads((plain / "eval" / "extrapolation.json").read_text())["results"]
    assert sorted(str(row.get("attn_temperature")) for row in rows) == ["None", "None"] + ["{'type': 'logn'}"] * 2
    assert "nonoverlapping logn" in done.stdout
    sample = cli.here("sample.py", f"run_dir={plain}", "model.attn_temperature.type=llama4", "sample.max_new_tokens=8")
    assert sample.returncode == 0, sample.stderr
    refused = cli.eval_here(plain, "model.attn_sink=true")
    assert_one_line_error(refused, "model.attn_sink cannot be changed for an evaluation")


@pytest.mark.slow
def test_a_nope_run_evaluated_with_the_drope_temperature_records_its_rows_beside_the_plain_ones(cli, tmp_path):
    run = tmp_path / "nope"
    done = cli.train_here(run, "pe=none", "train.max_steps=3")
    assert done.returncode == 0, done.stderr
    scored = ["eval.length_multipliers=[1,4]", "eval.protocols=[nonoverlapping]"]
    for extra in ([], ["model.attn_temperature.type=drope", "model.attn_temperature.c=0.2"]):
        done = cli.eval_here(run, *scored, *extra)
        assert done.returncode == 0, done.stderr
    rows = json.loads((run / "eval" / "extrapolation.json").read_text())["results"]
    by = {(row["length"], json.dumps(row["attn_temperature"])): row["loss"] for row in rows}
    drope = json.dumps({"type": "drope", "c": 0.2})
    assert set(by) == {(16, "null"), (64, "null"), (16, drope), (64, drope)}
    assert by[(16, drope)] == by[(16, "null")]  # s = 1 at the training length: no scale
    assert by[(64, drope)] != by[(64, "null")]
    assert "nonoverlapping drope(c=0.2)" in done.stdout
    refused = cli.eval_here(run, "model.attn_temperature.c=0.2")
    assert_one_line_error(refused, "model.attn_temperature.c=0.2 is read only when model.attn_temperature.type=drope")
