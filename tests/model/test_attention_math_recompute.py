"""The written-out attention path with gradients computes one block of queries at a time and computes each block
again in the backward pass (torch.utils.checkpoint), so the forward keeps no (B, H, T, T) tensor: CoPE's gates,
counts and interpolated logits exist for one block at a time. Its output and gradients must equal the whole
written-out formula's (one block, everything kept), at lengths that are and are not multiples of the block, for
several block sizes, in float32 and float64; and every scheme that trains on this path gives the same gradients in
blocks as in one block."""

import math

import pytest
import torch
from attention_cases import output_and_grads

import model.attention as attention
import model.kernels as kernels
from model.attention import AttentionCall, default_state
from model.kernels import attend, resolve_path
from model.pe import SCHEMES, ModelDims, build_positional_encoding

B, H, D = 2, 2, 8
WRITTEN_OUT = sorted(  # the schemes whose attention is always the written-out path
    name for name, cls in SCHEMES.items() if getattr(cls, "modifies", frozenset()) & {"score_mod", "weights"}
)


def written_out_block(q, k, v, pe, layer, start, stop):
    """The written-out attention of queries start..stop-1, with the scheme's changes (none read the layer's input)."""
    state = default_state(pe, q.shape[-2], k.shape[-2], q.device)
    call = AttentionCall(
        pe, resolve_path(pe, "math", q.device), state, layer, mods=pe.attention_mods(None, q, k, layer, None)
    )
    return attention._written_out_block(q, k, v, call, start, stop)[0]


def cope(dtype=torch.float32):
    dims = ModelDims(n_embd=H * D, n_head=H, head_dim=D, train_seq_len=64, init_std=0.02, n_layer=2)
    torch.manual_seed(0)
    pe = build_positional_encoding(SCHEMES["cope"].config_class(npos=16), dims)
    with torch.no_grad():
        pe.pos_emb.normal_()  # zeros would hide a wrong gradient path
    return pe.to(dtype)


def inputs(length, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    # scaled up so that some counts reach the clamp at npos - 1
    return [(torch.randn(B, H, length, D, generator=generator) * 2).to(dtype).requires_grad_() for _ in range(3)]


def whole_formula(q, k, v, pe, layer=1):
    """Golovneva et al. 2024's attention over the whole (T, T) at once: the scores, CoPE's content bias computed
    from all of them, softmax, values."""
    T = q.shape[-2]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    scores = (q @ k.transpose(-2, -1) / math.sqrt(D)).masked_fill(~causal, float("-inf"))
    scores = scores + pe.content_bias(q, scores, layer)
    return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v


def grads(pe, q, k, v, run):
    tensors = [q, k, v, *pe.parameters()]
    for t in tensors:
        t.grad = None
    out = run(q, k, v, pe)
    out.square().sum().backward()
    return [out.detach()] + [t.grad.clone() for t in tensors]


def blocks_kept(q, k, v, pe, block):
    """The written-out path as it was before blocks were recomputed: the same blocks, everything kept."""
    T = q.shape[-2]
    outputs = [written_out_block(q, k, v, pe, 1, s, min(T, s + block)) for s in range(0, T, block)]
    return torch.cat(outputs, dim=2)


def assert_same(got, want, rtol):
    """Elementwise, within rtol of each value and rtol of the largest value of its tensor (a gradient summed over
    many terms in another order)."""
    assert len(got) == len(want)
    names = ["output", "grad q", "grad k", "grad v"] + [f"grad of scheme parameter {i}" for i in range(len(got) - 4)]
    for g, w, name in zip(got, want, names, strict=True):
        atol = rtol * max(1.0, w.abs().max().item())
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, msg=lambda m, name=name: f"{name}: {m}")


LENGTHS_AND_BLOCKS = [(1, 4), (37, 4), (37, 16), (64, 16), (150, 64), (150, 128)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize(("length", "block"), LENGTHS_AND_BLOCKS)
def test_cope_in_recomputed_blocks_equals_the_blocks_kept_whole(length, block, dtype, monkeypatch):
    """The recomputation changes nothing: the same blocks computed once and kept for backward."""
    monkeypatch.setattr(attention, "_RECOMPUTED_BLOCK", block)
    pe = cope(dtype)
    q, k, v = inputs(length, dtype)
    want = grads(pe, q, k, v, lambda q, k, v, pe: blocks_kept(q, k, v, pe, block))
    got = grads(pe, q, k, v, lambda q, k, v, pe: attend(q, k, v, pe, "auto", layer=1))
    assert_same(got, want, rtol=1e-6)
    assert length == 1 or got[4].abs().sum() > 0  # the position vectors' gradient is real (one key: softmax is 1)


@pytest.mark.parametrize(("length", "block"), LENGTHS_AND_BLOCKS)
def test_cope_in_recomputed_blocks_equals_the_whole_formula(length, block, monkeypatch):
    """Against the whole (T, T) formula, in float64: the scores of a block and of the whole may differ in their last
    bit (another matrix product), which CoPE's float32 counts absorb in float64 (in float32 a count a bit from an
    integer could cross it, and the slope of the interpolation jumps there). The counts and the softmax are float32
    on both sides, hence float32's tolerance."""
    monkeypatch.setattr(attention, "_RECOMPUTED_BLOCK", block)
    pe = cope(torch.float64)
    q, k, v = inputs(length, torch.float64)
    want = grads(pe, q, k, v, whole_formula)
    got = grads(pe, q, k, v, lambda q, k, v, pe: attend(q, k, v, pe, "auto", layer=1))
    assert_same(got, want, rtol=1e-5)


def saved_for_backward(run) -> list[tuple[int, ...]]:
    """The shapes of the tensors autograd keeps for the backward pass while ``run()`` goes forward, outside any
    recomputed block (a checkpoint keeps its blocks' inputs by reference and recomputes the rest)."""
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return shapes


def test_the_forward_keeps_no_scores_for_backward(monkeypatch):
    """The whole formula keeps (B, H, T, T) tensors (gates, counts, probabilities); the blockwise path none of
    them, and nothing larger than q."""
    monkeypatch.setattr(attention, "_RECOMPUTED_BLOCK", 16)
    pe = cope()
    q, k, v = inputs(100, torch.float32)
    whole = saved_for_backward(lambda: whole_formula(q, k, v, pe))
    assert (B, H, 100, 100) in whole
    blocks = saved_for_backward(lambda: attend(q, k, v, pe, "auto", layer=1))
    assert all(math.prod(shape) <= q.numel() for shape in blocks), blocks


def test_nothing_is_recomputed_without_gradients_or_with_one_block(monkeypatch):
    calls = []
    monkeypatch.setattr(attention, "checkpoint", lambda *args, **kwargs: calls.append(1))
    pe = cope()
    q, k, v = inputs(40, torch.float32)
    with torch.no_grad():
        attend(q, k, v, pe, "auto", layer=1)
    probs = []
    attend(q, k, v, pe, "auto", layer=1, capture=probs)  # attention diagnostics keep the probabilities
    assert calls == [] and probs[0].shape == (B, H, 40, 40)
    monkeypatch.setattr(attention, "_RECOMPUTED_BLOCK", 40)  # one block of all the queries: kept as it is
    attend(q, k, v, pe, "auto", layer=1).sum().backward()
    assert calls == []


@pytest.mark.parametrize("name", WRITTEN_OUT)
def test_every_written_out_scheme_trains_the_same_in_recomputed_blocks(name, monkeypatch):
    """Blocks of 7 queries recomputed in the backward pass against one block of all 40, kept whole."""
    from attention_cases import qkv, scheme

    pe, (q, k, v) = scheme(name), qkv()

    monkeypatch.setattr(
        kernels,
        "written_out_attention",
        lambda q, k, v, call, **options: (written_out_block(q, k, v, call.pe, call.layer, 0, q.shape[-2]), None),
    )
    want = output_and_grads("math", pe, q, k, v, layer=1)
    monkeypatch.undo()
    monkeypatch.setattr(attention, "_RECOMPUTED_BLOCK", 7)
    # within rtol of each value and of its tensor's largest (a parameter's gradient sums over every pair, so its
    # rounding grows with it, and it differs between CPU kinds)
    assert_same(output_and_grads("math", pe, q, k, v, layer=1), want, rtol=1e-5)
