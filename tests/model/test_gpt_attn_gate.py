"""Gated attention (``model.attn_gate``; Qiu et al. 2025, the elementwise, head-specific gate after SDPA, "G1"): the
layer equals the reference's formula with the same weights, the gate acts on every attention path and scheme, it is
off by default (an old checkpoint's config without the key builds the model it was), and its parameters are counted."""

import math

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from experiment.compose import compose_config
from experiment.settings import trained_config
from model import GPT, KVCache, ModelConfig
from model.attention import default_state
from model.gpt import CausalSelfAttention
from model.kernels import choose_kernel
from model.pe import SCHEMES, ModelDims, build_positional_encoding

B, T, H, D = 2, 13, 4, 8
C = H * D
VOCAB = 61
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def reference_gated_attention(x, q_proj, k_proj, v_proj, o_proj, n_head):
    """qiuzh20/gated_attention's Qwen3 attention with ``elementwise_attn_output_gate``, written out: q_proj is twice
    as wide and holds, per head, the query and then the gate; the gate's sigmoid multiplies each head's attention
    output before o_proj. (No RoPE, no q/k norm, no grouped heads here: the gate is all this checks.)"""
    b, t, _ = x.shape
    query_states = F.linear(x, *q_proj).view(b, t, n_head, -1)
    head_dim = query_states.shape[-1] // 2
    query_states, gate_score = torch.split(query_states, [head_dim, head_dim], dim=-1)
    gate_score = gate_score.reshape(b, t, -1, head_dim)
    q = query_states.transpose(1, 2)
    k = F.linear(x, *k_proj).view(b, t, n_head, head_dim).transpose(1, 2)
    v = F.linear(x, *v_proj).view(b, t, n_head, head_dim).transpose(1, 2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    attn_output = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2)  # (b, t, heads, head_dim)
    attn_output = attn_output * torch.sigmoid(gate_score)
    return F.linear(attn_output.reshape(b, t, -1), *o_proj)


@pytest.mark.parametrize("bias", [False, True])
@torch.no_grad()
def test_the_layer_is_the_reference_formula_with_the_same_weights(bias):
    torch.manual_seed(0)
    layer = CausalSelfAttention(ModelConfig(n_head=H, n_embd=C, attn_gate=True, bias=bias), T).eval()
    for p in layer.parameters():
        p.normal_(0.0, 0.3)
    dims = ModelDims(n_embd=C, n_head=H, head_dim=D, train_seq_len=T, init_std=0.02)
    pe = build_positional_encoding(SCHEMES["none"].config_class(), dims)
    x = torch.randn(B, T, C)
    ours = layer(x, pe, default_state(pe, T, T, x.device), None, 0, choose_kernel(pe, "auto", x.device))

    # The reference's q_proj: per head h, the rows of our query for h, then the rows of our gate for h.
    w_q, w_k, w_v = layer.qkv.weight.split(C)
    w_qg = torch.cat((w_q.view(H, D, C), layer.gate.weight.view(H, D, C)), dim=1).reshape(2 * C, C)
    if bias:
        b_q, b_k, b_v = layer.qkv.bias.split(C)
        b_qg = torch.cat((b_q.view(H, D), layer.gate.bias.view(H, D)), dim=1).reshape(2 * C)
    else:
        b_q = b_k = b_v = b_qg = None
    theirs = reference_gated_attention(x, (w_qg, b_qg), (w_k, b_k), (w_v, b_v), (layer.proj.weight, layer.proj.bias), H)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def gated_model(pe_name: str, backend: str, gate: bool = True, **settings) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=4, n_head=H, n_embd=C, vocab_size=VOCAB, attn_backend=backend, attn_gate=gate)
    return GPT(cfg, SCHEMES[pe_name].config_class(**settings), train_seq_len=16).eval()


SCHEMES_TRIED = ["rope", "alibi", "fox", "cope", "stickbreaking", "swan"]


@pytest.mark.parametrize("pe_name", SCHEMES_TRIED)
def test_every_path_keeps_the_gate(pe_name):
    idx = torch.randint(0, VOCAB, (2, 21), generator=torch.Generator().manual_seed(1))
    want = gated_model(pe_name, "math")
    loss = want(idx, idx)
    loss.backward()
    got = gated_model(pe_name, "sdpa")
    other = got(idx, idx)
    other.backward()
    torch.testing.assert_close(other, loss, rtol=1e-4, atol=1e-5)
    for (name, p), (_, r) in zip(got.named_parameters(), want.named_parameters()):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
    with torch.no_grad():
        reference = want(idx)
        torch.testing.assert_close(gated_model(pe_name, "flex")(idx), reference, rtol=1e-4, atol=1e-5)
        cache = KVCache()
        steps = [want(idx[:, :4], cache=cache)] + [want(idx[:, t : t + 1], cache=cache) for t in range(4, 21)]
        torch.testing.assert_close(torch.cat(steps, dim=1), reference, rtol=1e-4, atol=1e-4)
        probs = []
        torch.testing.assert_close(want(idx, capture=probs), reference, rtol=1e-4, atol=1e-5)
        assert len(probs) == 4


@torch.no_grad()
def test_the_gate_changes_the_output_and_off_is_the_model_without_it():
    idx = torch.randint(0, VOCAB, (1, 9))
    plain, gated = gated_model("rope", "sdpa", gate=False), gated_model("rope", "sdpa")
    state = {k: v for k, v in gated.state_dict().items() if ".gate." not in k}
    plain.load_state_dict(state)
    assert not torch.allclose(plain(idx), gated(idx))
    for block in gated.blocks:  # a gate of +inf logits everywhere lets every head through whole
        block.attn.gate.weight.zero_()
        block.attn.gate.bias.fill_(50.0)
    torch.testing.assert_close(gated(idx), plain(idx))


def test_off_by_default_initialised_like_the_projections_and_counted():
    assert ModelConfig().attn_gate is False
    assert compose_config([]).model.attn_gate is False
    plain, gated = gated_model("rope", "sdpa", gate=False), gated_model("rope", "sdpa")
    per_layer = C * C + C  # W_g and its bias (model.bias)
    assert gated.num_params() - plain.num_params() == 4 * per_layer == gated.gate_params()
    assert plain.gate_params() == 0
    lines = gated.describe_attention(torch.device("cpu"))
    assert lines[-1] == f"attention output gate (sigmoid per head and channel): {4 * per_layer:,} parameters"
    assert len(plain.describe_attention(torch.device("cpu"))) == 4
    torch.manual_seed(1)
    big = GPT(
        ModelConfig(n_layer=2, n_head=4, n_embd=256, vocab_size=VOCAB, attn_gate=True),
        SCHEMES["rope"].config_class(),
        16,
    )
    weight = big.blocks[0].attn.gate.weight
    assert abs(weight.std().item() - big.cfg.init_std) < 0.002  # N(0, init_std) as q, k and v
    assert not big.blocks[0].attn.gate.bias.any()


def test_a_checkpoint_config_without_the_key_builds_the_ungated_model():
    saved = OmegaConf.to_container(compose_config([]), resolve=True)
    del saved["model"]["attn_gate"]
    assert trained_config(saved).model.attn_gate is False
