"""The length-dependent attention temperature (model/temperature.py): its factors against hand-computed values,
every attention path equal, the KV cache, randomized positions, off by default, config refusals, and one tiny
train + eval."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from cli_runs import assert_one_line_error

from core.errors import PosGPTError
from model import GPT, ModelConfig
from model.pe import SCHEMES
from model.temperature import AttentionTemperature, TemperatureConfig, check_evaluation_change

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
@pytest.mark.parametrize("kind", TYPES)
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
    with pytest.raises(PosGPTError, match="unknown model.attn_temperature.type"):
        tiny(type="warm")
    with pytest.raises(PosGPTError, match="divides by log"):
        AttentionTemperature(TemperatureConfig(type="logn"), 2, 1)
    with pytest.raises(PosGPTError, match="learns its parameters in training"):
        check_evaluation_change(TemperatureConfig(), TemperatureConfig(type="ssmax"))
    with pytest.raises(PosGPTError, match="learns its parameters in training"):
        check_evaluation_change(TemperatureConfig(type="ssmax"), TemperatureConfig(type="logn"))
    check_evaluation_change(TemperatureConfig(), TemperatureConfig(type="llama4"))  # parameter-free: allowed


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
