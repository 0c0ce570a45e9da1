"""Attention sinks (model/sink.py): every attention path against a hand-computed case and the reference formula
softmax([s, scores]) without the sink's column, gradients, the KV cache, off by default, and one train + eval."""

import json
import math

import pytest
import torch
from omegaconf import OmegaConf

from model import GPT, ModelConfig
from model.kernels import attend
from model.pe import SCHEMES
from model.pe import capabilities as cap

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")  # flex on CPU


def scheme(name: str, n_head: int = 2):
    from model.pe import ModelDims, build_positional_encoding

    return build_positional_encoding(SCHEMES[name].config_class(), ModelDims(8, n_head, 8 // n_head, 16, 0.02))


def reference(q, k, v, sink, bias=None):
    """out_i = sum_j exp(z_ij) v_j / (exp(s_h) + sum_j exp(z_ij)), causal, written with loops over queries."""
    B, H, T, D = q.shape
    out = torch.zeros_like(q, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                z = (q[b, h, i].double() @ k[b, h, : i + 1].double().T) / math.sqrt(D)
                if bias is not None:
                    z = z + bias[h, i, : i + 1]
                weights = z.exp() / (math.exp(float(sink[h])) + z.exp().sum())
                out[b, h, i] = weights @ v[b, h, : i + 1].double()
    return out.float()


def test_hand_computed_case():
    """One head, one dimension: q = 1, keys 0 and log 2 (scores 0, log 2), values 1 and 4, sink log 3. Query 1's
    output is (1 * 1 + 2 * 4) / (3 + 1 + 2) = 1.5; query 0's is 1 / (3 + 1) = 0.25."""
    q = torch.ones(1, 1, 2, 1)
    k = torch.tensor([0.0, math.log(2)]).view(1, 1, 2, 1)
    v = torch.tensor([1.0, 4.0]).view(1, 1, 2, 1)
    sink = torch.tensor([math.log(3)])
    pe = scheme("none", n_head=1)
    for backend in ("math", "sdpa", "flex"):
        out = attend(q, k, v, pe, backend, sink=sink)
        assert out.flatten().tolist() == pytest.approx([0.25, 1.5], abs=1e-6), backend


@pytest.mark.parametrize("pe_name", ["none", "rope", "alibi"])
@pytest.mark.parametrize("backend", ["math", "sdpa", "flex"])
def test_every_path_equals_the_formula(pe_name, backend):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 7, 4) for _ in range(3))
    sink = torch.tensor([0.5, -1.0])
    pe = scheme(pe_name)
    bias = pe.bias_block(torch.arange(7), torch.arange(7), 0) if isinstance(pe, cap.ScoreBias) else None
    expected = reference(q, k, v, sink, bias)
    assert torch.allclose(attend(q, k, v, pe, backend, sink=sink), expected, atol=1e-5)
    capture: list = []
    assert torch.allclose(attend(q, k, v, pe, backend, sink=sink, capture=capture), expected, atol=1e-5)
    assert (capture[0].sum(-1) < 1).all()  # the sink takes a share of every row


def test_the_blockwise_path_with_a_cache_offset_equals_the_formula():
    """Queries after cached keys (q_offset > 0) run sdpa blockwise with a mask: the sink is a masked column too."""
    from model.attention import default_state

    torch.manual_seed(1)
    q_all, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    sink = torch.tensor([1.0, 0.0])
    pe = scheme("none")
    state = default_state(pe, 2, 6, torch.device("cpu"))
    out = attend(q_all[:, :, 4:], k, v, pe, "sdpa", state, sink=sink)
    assert torch.allclose(out, reference(q_all, k, v, sink)[:, :, 4:], atol=1e-5)


def test_sdpa_gradients_equal_the_written_out_ones():
    torch.manual_seed(2)
    pe = scheme("rope")
    grads = {}
    for backend in ("math", "sdpa"):
        torch.manual_seed(3)
        q, k, v = (torch.randn(2, 2, 9, 4, requires_grad=True) for _ in range(3))
        sink = torch.tensor([0.3, -0.2], requires_grad=True)
        (attend(q, k, v, pe, backend, sink=sink) ** 2).sum().backward()
        grads[backend] = [t.grad for t in (q, k, v, sink)]
    for ours, written in zip(grads["sdpa"], grads["math"]):
        assert torch.allclose(ours, written, atol=1e-5)


def tiny(sink: bool, pe: str = "rope") -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=64, attn_sink=sink)
    return GPT(cfg, SCHEMES[pe].config_class(), train_seq_len=8)


@pytest.mark.parametrize("pe", ["rope", "alibi", "sinusoidal"])
def test_model_backends_and_kv_cache_agree(pe):
    from model.gpt import KVCache

    model = tiny(True, pe).eval()
    x = torch.randint(0, 64, (2, 12))
    outputs = {}
    with torch.no_grad():
        for backend in ("sdpa", "math", "flex"):
            for block in model.blocks:
                block.attn.backend = backend
            outputs[backend] = model(x)
        cache = KVCache()
        steps = [model(x[:, :4], cache=cache)] + [model(x[:, t : t + 1], cache=cache) for t in range(4, 12)]
    assert torch.allclose(outputs["sdpa"], outputs["math"], atol=1e-5)
    assert torch.allclose(outputs["flex"], outputs["math"], atol=1e-5)
    assert torch.allclose(torch.cat(steps, dim=1), outputs["math"], atol=1e-5)


def test_initialisation_and_off_by_default():
    model = tiny(True)
    sinks = torch.stack([block.attn.sink for block in model.blocks])
    assert sinks.shape == (2, 2) and 0 < sinks.std() < 0.1  # N(0, init_std), as gpt-oss in transformers
    plain = tiny(False)
    assert all(block.attn.sink is None for block in plain.blocks)
    assert not [name for name in plain.state_dict() if "sink" in name]
    x = torch.randint(0, 64, (1, 6))
    assert model(x, x).backward() is None and model.blocks[0].attn.sink.grad.abs().sum() > 0


def test_the_default_config_has_no_sink():
    from experiment.compose import compose_config

    assert OmegaConf.select(compose_config([]), "model.attn_sink") is False


@pytest.mark.slow
def test_train_and_evaluate_with_sinks(cli, tmp_path):
    run = tmp_path / "sink"
    done = cli.train_here(run, "train.max_steps=3", "pe=rope", "model.attn_sink=true")
    assert done.returncode == 0, done.stderr
    done = cli.eval_here(run, "eval.length_multipliers=[1,2]", "eval.protocols=[nonoverlapping]")
    assert done.returncode == 0, done.stderr
    rows = json.loads((run / "eval" / "extrapolation.json").read_text())["results"]
    assert all(row["ppl"] is not None for row in rows)
    sample = cli.here("sample.py", f"run_dir={run}", "sample.max_new_tokens=5", "sample.prompt=def")
    assert sample.returncode == 0, sample.stderr


def test_the_sink_as_a_key_with_a_dummy_query_equals_the_formula():
    """The full-sequence sdpa path off CPU (CUDA): the sink as key 0 and a dropped first query, under is_causal."""
    import torch.nn.functional as F

    from model.sink import sink_as_key

    torch.manual_seed(4)
    q, k, v = (torch.randn(2, 2, 7, 4, requires_grad=True) for _ in range(3))
    sink = torch.tensor([0.5, -1.0], requires_grad=True)
    q1, k1, v1 = sink_as_key(q, k, v, sink, dummy_query=True)
    out = F.scaled_dot_product_attention(q1, k1, v1, is_causal=True, scale=0.5)[:, :, 1:]
    assert torch.allclose(out, reference(q, k, v, sink.detach()), atol=1e-5)
    out.sum().backward()
    assert sink.grad.abs().sum() > 0
