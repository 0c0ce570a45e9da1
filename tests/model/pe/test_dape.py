"""DAPE: the bias B + f(S, B) against the module docstring's equation and an independent transcription of the
reference code's forward (chuanyang-Zheng/DAPE, megatron/model/positional_embeddings.py, ``AliBi_C`` and
``ParallelKerpleLog_C``), through attention, per layer, and in a model."""

import math

import pytest
import torch
import torch.nn.functional as F

from core.errors import PosGPTError
from model import GPT
from model.attention import default_state
from model.gpt import ModelConfig
from model.kernels import attend
from model.pe import SCHEMES, ModelDims
from model.pe.dape import DAPEConfig, index_distances

H, D, T = 4, 8, 12
DIMS = ModelDims(n_embd=H * D, n_head=H, head_dim=D, train_seq_len=T, init_std=0.02, n_layer=2)
CAUSAL = torch.ones(T, T, dtype=torch.bool).tril()


def dape(static_bias="kerple", **settings):
    torch.manual_seed(0)
    pe = SCHEMES["dape"](DAPEConfig(static_bias=static_bias, **settings), DIMS)
    if static_bias == "kerple":
        with torch.no_grad():  # away from the clamp at 1e-2, which the reference applies in place
            pe.bias_p.uniform_(0.2, 2.0)
            pe.bias_a.uniform_(0.2, 1.0)
    return pe


def reference_slopes(n):
    """``AliBi_C._get_slopes`` for a power of two: start = 2^(-2^-(log2 n - 3)), ratio = start."""
    start = 2 ** (-(2 ** -(math.log2(n) - 3)))
    return torch.tensor([start * start**i for i in range(n)])


def reference_forward(x, mlp, static, slopes=None, bias_p=None, bias_a=None):
    """The reference modules' forward on the unmasked, scaled scores x (B, H, T, T): the distances tril(i - j)
    (0 where j > i), the static bias a from them, torch.cat((x, tile(a)), dim=1) through Linear, LeakyReLU(0.01),
    Linear over the stacked heads, and x + a + that (the softmax applies the causal mask afterwards)."""
    n = x.shape[-1]
    diff = torch.tril(torch.arange(n).view(n, 1).repeat(1, n) + torch.arange(0, -n, -1)).to(x.dtype)
    if static == "alibi":
        a = -diff * slopes.view(-1, 1, 1)
    else:
        a = -bias_p.view(-1, 1, 1) * torch.log(1 + bias_a.view(-1, 1, 1) * diff)
    stacked = torch.cat((x, torch.tile(a, (x.shape[0], 1, 1, 1))), dim=1).permute(0, 2, 3, 1)
    hidden = F.leaky_relu(stacked @ mlp[0].weight.t() + mlp[0].bias, negative_slope=0.01)
    correction = (hidden @ mlp[2].weight.t() + mlp[2].bias).permute(0, 3, 1, 2)
    return x + a + correction


def reference_for(pe, x, layer):
    if pe.cfg.static_bias == "alibi":
        return reference_forward(x, pe.mlps[layer], "alibi", slopes=reference_slopes(H))
    return reference_forward(x, pe.mlps[layer], "kerple", bias_p=pe.bias_p[layer], bias_a=pe.bias_a[layer])


def masked(scores):
    return scores.masked_fill(~CAUSAL, float("-inf"))


@pytest.mark.parametrize("static_bias", ["kerple", "alibi"])
def test_the_logits_equal_the_reference_forward_on_the_causal_part(static_bias):
    pe = dape(static_bias)
    x = torch.randn(2, H, T, T) * 2
    for layer in (0, 1):
        got = masked(x) + pe.content_bias(None, masked(x), layer)
        want = reference_for(pe, x, layer)
        torch.testing.assert_close(got[..., CAUSAL], want[..., CAUSAL], rtol=1e-5, atol=1e-5)
        assert torch.isneginf(got[..., ~CAUSAL]).all()  # what f gives above the diagonal never counts
    assert not torch.allclose(pe.content_bias(None, masked(x), 0), pe.content_bias(None, masked(x), 1))  # per layer


def test_the_bias_is_the_docstrings_equation_at_each_pair():
    pe = dape("kerple", mlp_width=5)
    x = torch.randn(1, H, T, T)
    got = pe.content_bias(None, masked(x), 1)
    W1, b1, W2, b2 = pe.mlps[1][0].weight, pe.mlps[1][0].bias, pe.mlps[1][2].weight, pe.mlps[1][2].bias
    r1, r2 = pe.bias_p[1], pe.bias_a[1]
    for i, j in [(0, 0), (5, 2), (11, 0), (11, 11)]:
        B = -r1 * torch.log1p(r2 * (i - j))  # KERPLE's log kernel, every head
        hidden = W1 @ torch.cat((x[0, :, i, j], B)) + b1
        f = W2 @ torch.where(hidden > 0, hidden, 0.01 * hidden) + b2
        torch.testing.assert_close(got[0, :, i, j], B + f, rtol=1e-5, atol=1e-6)
    alibi = dape("alibi")
    slopes = torch.tensor([2.0 ** (-8 * h / H) for h in range(1, H + 1)])
    assert torch.equal(alibi.slopes, slopes) and torch.allclose(slopes, reference_slopes(H))


def test_attention_adds_it_and_its_blocks_and_a_decoding_step_agree(monkeypatch):
    import model.attention as attention

    pe = dape("kerple")
    q, k, v = (torch.randn(2, H, T, D) for _ in range(3))
    x = q @ k.transpose(-2, -1) / math.sqrt(D)
    probs = torch.softmax(masked(reference_for(pe, x, 1)), dim=-1)
    whole = attend(q, k, v, pe, "auto", layer=1)
    torch.testing.assert_close(whole, probs @ v, rtol=1e-5, atol=1e-6)
    step = attend(q[:, :, -1:], k, v, pe, "auto", default_state(pe, 1, T, q.device), layer=1)  # a KV cache's query
    torch.testing.assert_close(step, whole[:, :, -1:], rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(attention, "_MAX_BLOCK_SCORES", 2 * H * T * 3)  # blocks of 3 queries
    torch.testing.assert_close(attend(q, k, v, pe, "auto", layer=1), whole, rtol=1e-5, atol=1e-6)


def test_distances_are_counted_from_the_mask_within_each_document():
    documents = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    same = documents[:, None] == documents[None, :]
    visible = same & torch.ones(8, 8, dtype=torch.bool).tril()
    distance = index_distances(visible)
    i, j = torch.arange(8)[:, None], torch.arange(8)[None, :]
    assert torch.equal(distance[visible], (i - j).expand(8, 8)[visible])
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    assert torch.equal(index_distances(CAUSAL)[CAUSAL], (i - j).expand(T, T)[CAUSAL])


def test_settings_are_checked_and_the_kernel_is_not_weight_decayed():
    with pytest.raises(PosGPTError, match="pe.static_bias='t5' is not one of its choices: kerple, alibi"):
        SCHEMES["dape"](DAPEConfig(static_bias="t5"), DIMS)
    kerple, alibi = dape("kerple"), dape("alibi")
    assert {id(p) for p in kerple.no_weight_decay()} == {id(kerple.bias_p), id(kerple.bias_a)}
    assert kerple.bias_p.shape == (2, H) and alibi.no_weight_decay() == []
    assert len(kerple.mlps) == 2 and kerple.mlps[0][0].in_features == 2 * H and kerple.mlps[0][2].out_features == H
    assert not SCHEMES["dape"].uses_positions()  # distances by index, as the reference's
    with pytest.raises(PosGPTError, match="random_positions"):
        kerple.check_random_positions(64)


@pytest.mark.parametrize("static_bias", ["kerple", "alibi"])
def test_a_tiny_model_trains_and_runs_past_its_training_length(static_bias):
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=61), DAPEConfig(static_bias=static_bias), 16)
    idx = torch.randint(0, 61, (2, 16))
    loss = model(idx[:, :-1], targets=idx[:, 1:])
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.pe.parameters())  # f (and r1, r2)
    with torch.no_grad():
        logits = model(torch.randint(0, 61, (1, 128)))  # 8x the training length
    assert logits.shape == (1, 128, 61) and torch.isfinite(logits).all()
