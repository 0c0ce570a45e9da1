"""FlexAttention's score_mod for a bias of the distance alone (``bias_is_relative``, positions 0..T-1) whose own
score_mod does not compile reads one table per forward pass, ``table[h, q_idx - kv_idx]``, built by the scheme's own
code, instead of running ``score_bias`` per score; one whose score_mod compiles computes its bias in the kernel.
Forward through FlexAttention (CPU, eager) against the math path; gradients, which FlexAttention cannot take on CPU,
through the same score_mod evaluated at every (query, key) pair against ``score_bias`` evaluated there (the direct
computation), in float32 and float64, and through FlexAttention's own eager reference (math_attention) against the
math path: the table's gradients must reach the scheme's parameters unchanged. Also ``model.flex_kernel_options``:
handed to FlexAttention, checked against its option names."""

import math
import sys

import pytest
import torch
import torch.nn.attention.flex_attention  # noqa: F401  (loads torch._higher_order_ops.flex_attention)
from attention_cases import B, D, H, assert_all_close, output_and_grads, qkv, scheme

import model.kernels as kernels
from core.errors import PosGPTError
from experiment.compose import compose_config
from experiment.config import validate
from model.attention import AttentionCall, default_state
from model.kernels import attend, choose_kernel, resolve_path
from model.pe import SCHEMES
from model.pe import capabilities as cap

RELATIVE = sorted(name for name, cls in SCHEMES.items() if issubclass(cls, cap.DistanceBias))
TABLE = [
    name for name in RELATIVE if issubclass(SCHEMES[name], cap.UncompiledScoreBias)
]  # FlexAttention reads their table
AWKWARD = [1, 127, 129, 300]  # FlexAttention's blocks hold 128 queries and 128 keys
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def test_the_registry_has_relative_schemes():
    assert {"alibi", "t5", "kerple"} <= set(RELATIVE) and "kerple" in TABLE


@pytest.mark.parametrize("name", sorted(set(RELATIVE) - set(TABLE)))
def test_a_score_mod_that_compiles_computes_its_bias_in_the_kernel(name, monkeypatch):
    """The table is a gather in the kernel, which costs shared memory; a scheme whose own score_mod compiles runs it."""
    pe = scheme(name)
    monkeypatch.setattr(kernels, "distance_bias", lambda *args: pytest.fail("the score_mod read the table"))
    score_mod = score_mod_of(pe, default_state(pe, 9, 9, torch.device("cpu")), 1)
    i, j = torch.arange(9)[:, None], torch.arange(9)[None, :]
    torch.testing.assert_close(score_mod(torch.zeros(9, 9), 0, 1, i, j), pe.score_bias(i, j, 1, 1))


def score_mod_of(pe, state, layer):
    """The FlexAttention score_mod a layer of ``pe`` runs."""
    return kernels._score_mod(AttentionCall(pe, resolve_path(pe, "flex", "cpu"), state, layer))


def dense_attention(q, k, v, bias):
    """softmax(q k^T / sqrt(d) + bias + causal mask) v in q's dtype throughout; ``bias(b, h, i, j)`` gets index
    tensors broadcast over (B, H, T, T), as FlexAttention's score_mod gets them one score at a time."""
    T = q.shape[-2]
    b, h = torch.arange(B)[:, None, None, None], torch.arange(H)[None, :, None, None]
    i, j = torch.arange(T)[None, None, :, None], torch.arange(T)[None, None, None, :]
    scores = bias(q @ k.transpose(-2, -1) / math.sqrt(D), b, h, i, j)
    return torch.softmax(scores.masked_fill(j > i, float("-inf")), dim=-1) @ v


def grads_through(pe, q, k, v, bias):
    tensors = [q, k, v, *pe.parameters()]
    for t in tensors:
        t.grad = None
    out = dense_attention(q, k, v, bias)
    out.square().sum().backward()
    return [out.detach()] + [t.grad.clone() if t.grad is not None else torch.zeros_like(t) for t in tensors]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("name", TABLE)
def test_the_table_score_mod_gives_the_direct_bias_and_its_gradients(name, dtype, monkeypatch):
    """Output and gradients of q, k, v and of the scheme's parameters (layer 1: per-layer ones too), the score_mod
    that FlexAttention gets against score_bias at every pair; and the score_mod never calls score_bias itself."""
    pe = scheme(name).to(dtype)
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in qkv(tq=75, tk=75))
    score_mod = score_mod_of(pe, default_state(pe, 75, 75, q.device), 1)
    want = grads_through(pe, q, k, v, lambda s, b, h, i, j: s + pe.score_bias(i, j, h, 1))
    monkeypatch.setattr(pe, "score_bias", lambda *args: pytest.fail("the score_mod ran score_bias"))
    got = grads_through(pe, q, k, v, score_mod)
    tolerance = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    assert_all_close(got, want, **tolerance)
    assert any(g.abs().sum() > 0 for g in got[4:]) or not any(True for _ in pe.parameters())


@pytest.mark.parametrize("name", RELATIVE)
def test_the_score_mod_gradients_equal_the_math_paths(name):
    """The same score_mod's gradients against the written-out path's (its softmax in float32)."""
    pe, (q, k, v) = scheme(name), qkv(tq=75, tk=75)
    score_mod = score_mod_of(pe, default_state(pe, 75, 75, q.device), 1)
    got = grads_through(pe, q, k, v, score_mod)
    assert_all_close(got, output_and_grads("math", pe, q, k, v, layer=1), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", RELATIVE)
def test_gradients_through_flex_attentions_own_reference(name):
    """FlexAttention's eager reference (torch._higher_order_ops.flex_attention.math_attention: the score_mod applied
    by vmap over batch, head, query and key, the block mask, its softmax), which has gradients on CPU, with the
    table's score_mod: output and gradients equal the written-out path's, at a length past one block of 128."""
    reference = getattr(sys.modules.get("torch._higher_order_ops.flex_attention"), "math_attention", None)
    if reference is None:
        pytest.skip("this torch has no FlexAttention math_attention")
    pe, (q, k, v) = scheme(name), qkv(tq=129, tk=129)
    score_mod = score_mod_of(pe, default_state(pe, 129, 129, q.device), 1)
    block_mask = kernels._make_causal_block_mask(129, "cpu").as_tuple()
    tensors = [q, k, v, *pe.parameters()]
    out = reference(q, k, v, score_mod, block_mask, D**-0.5, {})[0]
    out.square().sum().backward()
    got = [out.detach()] + [t.grad.clone() if t.grad is not None else torch.zeros_like(t) for t in tensors]
    assert_all_close(got, output_and_grads("math", pe, q, k, v, layer=1), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("length", AWKWARD)
@pytest.mark.parametrize("name", RELATIVE)
@torch.no_grad()
def test_flex_with_the_table_matches_math(name, length, dtype):
    """Through FlexAttention itself (eager, forward only on CPU), both layers; the math path's softmax is float32,
    hence float32's tolerance in float64 too."""
    pe = scheme(name).to(dtype)
    q, k, v = (t.to(dtype) for t in qkv(length, length, requires_grad=False))
    for layer in (0, 1):
        torch.testing.assert_close(
            attend(q, k, v, pe, "flex", layer=layer), attend(q, k, v, pe, "math", layer=layer), rtol=1e-4, atol=1e-5
        )


@pytest.mark.parametrize("name", TABLE)
def test_the_table_is_built_once_per_forward_pass_and_layer(name, monkeypatch):
    """The scheme's code runs once per forward pass (per layer if its bias depends on the layer), on T distances."""
    calls = []
    pe = scheme(name)
    original = pe.bias_block

    def counted(q_pos, k_pos, layer):
        calls.append((tuple(q_pos.shape), tuple(k_pos.shape), layer))
        return original(q_pos, k_pos, layer)

    monkeypatch.setattr(pe, "bias_block", counted)
    state = default_state(pe, 50, 50, torch.device("cpu"))
    for layer in (0, 1, 0, 1):
        score_mod_of(pe, state, layer)
    layers = [0, 1] if isinstance(pe, cap.LayerwiseBias) else [0]
    assert calls == [((50,), (1,), layer) for layer in layers]


@torch.no_grad()
def test_kernel_options_reach_flex_attention(monkeypatch):
    """The layer hands model.flex_kernel_options to FlexAttention's kernel as given (none when empty)."""
    seen = []
    flex = kernels._flex_function

    def spy(device):
        def kernel(*args, **kwargs):
            seen.append(kwargs.get("kernel_options"))
            return flex(device)(*args, **kwargs)

        return kernel

    monkeypatch.setattr(kernels, "_flex_function", spy)
    pe, (q, k, v) = scheme("alibi"), qkv(requires_grad=False)
    attend(q, k, v, pe, "flex")
    attend(q, k, v, pe, "flex", kernel_options={})
    attend(q, k, v, pe, "flex", kernel_options={"bwd_num_stages": 2, "BLOCK_M": 64})
    assert seen == [None, None, {"bwd_num_stages": 2, "BLOCK_M": 64}]


def test_kernel_options_are_composed_and_checked():
    """Hydra adds a key to the (empty) dict with a +, one key or several."""
    cfg = compose_config(
        ["+model.flex_kernel_options={BLOCK_M:64,bwd_BLOCK_N1:32}", "+model.flex_kernel_options.bwd_num_stages=2"]
    )
    validate(cfg, reads_data=False)
    assert dict(cfg.model.flex_kernel_options) == {"BLOCK_M": 64, "bwd_BLOCK_N1": 32, "bwd_num_stages": 2}
    with pytest.raises(PosGPTError, match="'BLOCK_Q' is not one of FlexAttention's FlexKernelOptions"):
        validate(compose_config(["+model.flex_kernel_options.BLOCK_Q=64"]), reads_data=False)
    with pytest.raises(PosGPTError, match="must be a number"):
        validate(compose_config(["+model.flex_kernel_options.BLOCK_M=[64]"]), reads_data=False)


@pytest.mark.slow  # dynamo's capture: about 1.5 s a scheme
@pytest.mark.parametrize("name", RELATIVE)
@torch.no_grad()
def test_the_score_mod_compiles_as_one_graph(name):
    """Dynamo captures FlexAttention with the scheme's score_mod whole, the table's or its own (fullgraph: no graph
    break; aot_eager: no code generation on CPU), and it computes what the math path does."""
    torch._dynamo.reset()
    pe, (q, k, v) = scheme(name), qkv(129, 129, requires_grad=False)
    kernel = choose_kernel(pe, "flex", "cpu")

    def layer(q, k, v):
        return kernel(q, k, v, AttentionCall(pe, kernel.path, default_state(pe, 129, 129, q.device), 1))

    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), attend(q, k, v, pe, "math", layer=1), rtol=1e-4, atol=1e-5)
