"""PoPE (model/pe/pope.py) against its two reference implementations, run here on the same seeded random inputs
(both are test-only dependencies, requirements-dev.txt): PyPI PoPE-pytorch's scores, attention outputs and
gradients, the phase bias's clamp included, and x-transformers' polar_pos_emb through its own attention (its
``Attend``, written out and on SDPA); the paper's equation pair by pair; the fused kernel running with one head
size; cached decoding, randomized positions, a sink; the settings.

Comparisons with PoPE-pytorch run in float64 (its frequencies given as its own default formula, in float64): the
only rounding left is posgpt's cos and sin, stored in float32 (6e-8 relative), hence 1e-6. x-transformers computes
its polar forms in float32 whatever its input's dtype, so those comparisons run in float32, within 1e-5.
"""

import math
import re

import pytest
import torch
import torch.nn.functional as F
from PoPE_pytorch import PoPE
from PoPE_pytorch.attention import compute_attn_similarity_non_fused, flash_attn_with_pope
from rope_remap_cases import posgpt_attention
from x_transformers.attend import Attend
from x_transformers.x_transformers import PolarEmbedding, apply_polar_pos_emb

from core.errors import PosGPTError
from experiment.compose import compose_config
from experiment.config import validate
from model import GPT
from model.gpt import KVCache, ModelConfig
from model.kernels import resolve_backend
from model.pe import SCHEMES, ModelDims
from model.pe.pope import PoPEConfig, pope_frequencies

D, H = 8, 3
DIMS = ModelDims(n_embd=H * D, n_head=H, head_dim=D, train_seq_len=16, init_std=0.02)
TIGHT = {"rtol": 1e-6, "atol": 1e-6}  # float64 against float64, but for posgpt's float32 cos and sin


def inputs(T: int, seed: int, dtype=torch.float64) -> tuple[torch.Tensor, ...]:
    """q, k, v of shape (2, H, T, D) and a phase per head and frequency drawn from [-8, 2], so that some lie
    outside the clamp [-2 pi, 0] on either side."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, H, T, D, generator=generator, dtype=dtype) for _ in range(3))
    return q, k, v, (torch.rand(H, D, generator=generator, dtype=dtype) * 10 - 8)


def posgpt_pope(phase: torch.Tensor | None = None, dtype=torch.float64, **settings) -> torch.nn.Module:
    pe = SCHEMES["pope"](PoPEConfig(**settings), DIMS).to(dtype)
    if phase is not None:
        with torch.no_grad():
            pe.phase.copy_(phase)
    return pe


def reference_pope(phase: torch.Tensor) -> PoPE:
    """PoPE-pytorch's module with its phase bias set, its frequencies ``theta ** -(arange(dim) / dim)`` in
    float64."""
    reference = PoPE(D, heads=H, inv_freqs=10000.0 ** -(torch.arange(D, dtype=torch.float64) / D)).double()
    with torch.no_grad():
        reference.bias.copy_(phase)
    return reference


def test_the_frequencies_are_pope_pytorchs_and_x_transformers():
    theta = pope_frequencies(D, 10000.0)
    torch.testing.assert_close(PoPE(D, heads=H).inv_freqs.double(), theta, rtol=1e-7, atol=0)
    torch.testing.assert_close(PolarEmbedding(D, H).inv_freq.double(), theta, rtol=1e-7, atol=0)


@pytest.mark.parametrize("offset", [0, 1000])
def test_scores_equal_pope_pytorchs(offset):
    """posgpt's q . k / sqrt(size of q), as every attention path scales it, is the reference's similarity
    (compute_attn_similarity_non_fused) times the softmax scale 1 / sqrt(d) flash_attn_with_pope applies."""
    T = 12
    q, k, _, phase = inputs(T, seed=0)
    positions = torch.arange(offset, offset + T)
    rq, rk = posgpt_pope(phase).rotate(q, k, positions, T)
    assert rq.shape == rk.shape == (2, H, T, 2 * D)
    want = compute_attn_similarity_non_fused(q, k, reference_pope(phase)(T, offset=offset)) * D**-0.5
    torch.testing.assert_close(rq @ rk.transpose(-2, -1) / math.sqrt(rq.shape[-1]), want, **TIGHT)


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_attention_and_gradients_equal_pope_pytorchs(backend):
    """Outputs and probabilities against flash_attn_with_pope (causal, its SDPA path on CPU), and the gradients
    of q, k, v and of the phase bias, which is 0 where the bias is clamped."""
    T = 11
    q, k, v, phase = inputs(T, seed=1)
    weights = torch.randn(2, H, T, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    reference = reference_pope(phase)
    theirs = [t.clone().requires_grad_() for t in (q, k, v)]
    want = flash_attn_with_pope(*theirs, pos_emb=reference(T), causal=True, fused=False)
    (want * weights).sum().backward()
    pe = posgpt_pope(phase)
    ours = [t.clone().requires_grad_() for t in (q, k, v)]
    got, probs = posgpt_attention(pe, *ours, backend=backend)
    (got * weights).sum().backward()
    torch.testing.assert_close(got, want, **TIGHT)
    scores = compute_attn_similarity_non_fused(q, k, reference(T)) * D**-0.5
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    torch.testing.assert_close(probs.double(), scores.masked_fill(~causal, -math.inf).softmax(-1), **TIGHT)
    for mine, reference_tensor in zip(ours, theirs):
        torch.testing.assert_close(mine.grad, reference_tensor.grad, **TIGHT)
    torch.testing.assert_close(pe.phase.grad, reference.bias.grad, **TIGHT)
    clamped = (phase < -2 * math.pi) | (phase > 0)
    assert clamped.any() and (pe.phase.grad[clamped] == 0).all() and (pe.phase.grad[~clamped] != 0).all()


@pytest.mark.parametrize("flash", [False, True])
def test_attention_equals_x_transformers(flash):
    """x-transformers' polar_pos_emb: PolarEmbedding's frequencies and bias (shared by every layer there, as here),
    apply_polar_pos_emb on q at freqs and on k at freqs + bias (Attention.forward), then its Attend with the
    scale Attention gives it, dim_head ** -0.5: written out, or on SDPA (``flash``)."""
    T = 10
    q, k, v, phase = inputs(T, seed=3, dtype=torch.float32)
    embedding = PolarEmbedding(D, H)
    with torch.no_grad():
        embedding.learned_bias.copy_(phase[:, None, :])
    freqs, bias = embedding(torch.arange(T))
    want, _ = Attend(causal=True, scale=D**-0.5, flash=flash)(
        apply_polar_pos_emb(q, freqs), apply_polar_pos_emb(k, freqs + bias), v
    )
    got, _ = posgpt_attention(posgpt_pope(phase, dtype=torch.float32), q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_uniform_start_is_the_references():
    """Their ``bias_uniform_init`` draws in place on a parameter that needs a gradient, which autograd refuses
    outside no_grad (PoPE-pytorch 0.2.1, x-transformers 2.31): built under no_grad here."""
    torch.manual_seed(0)
    ours = posgpt_pope(phase_bias="uniform").phase
    with torch.no_grad():
        theirs = [PoPE(D, heads=H, bias_uniform_init=True).bias, PolarEmbedding(D, H, True).learned_bias[:, 0]]
    for phase in (ours, *theirs):
        assert phase.shape == (H, D) and (phase >= -2 * math.pi).all() and (phase <= 0).all() and phase.std() > 1


def test_scores_are_the_papers_equation_pair_by_pair():
    """a_ts = sum_c softplus(q_tc) softplus(k_sc) cos((s - t) theta_c + delta_c) / sqrt(d), delta clamped."""
    T = 7
    q, k, _, phase = inputs(T, seed=4)
    rq, rk = posgpt_pope(phase).rotate(q, k, torch.arange(T), T)
    got = rq @ rk.transpose(-2, -1) / math.sqrt(rq.shape[-1])
    theta, delta = pope_frequencies(D, 10000.0), phase.clamp(-2 * math.pi, 0)[None, :, None, :]
    for t in range(T):
        for s in range(T):
            terms = F.softplus(q[..., t, :]) * F.softplus(k[..., s, :]) * torch.cos((s - t) * theta + delta[..., 0, :])
            torch.testing.assert_close(got[..., t, s], terms.sum(-1) / math.sqrt(D), **TIGHT)


def test_without_a_phase_bias_the_scores_depend_on_content_and_distance_only():
    q, k, _, _ = inputs(6, seed=5)
    pe = posgpt_pope(phase_bias="none")
    assert pe.phase is None and pe.no_weight_decay() == [] and list(pe.parameters()) == []
    near = pe.rotate(q, k, torch.arange(6), 6)
    far = pe.rotate(q, k, torch.arange(16_000, 16_006), 16_006)
    torch.testing.assert_close(near[0] @ near[1].mT, far[0] @ far[1].mT, **TIGHT)


def test_the_fused_causal_kernel_runs_with_one_head_size(monkeypatch):
    """Training's path on CPU: sdpa with is_causal and no mask, v padded to q's 2d (model/kernels.py)."""
    calls = []
    sdpa = F.scaled_dot_product_attention

    def recording(q, k, v, *args, **kwargs):
        calls.append((q.shape[-1], k.shape[-1], v.shape[-1], kwargs.get("attn_mask"), kwargs.get("is_causal")))
        return sdpa(q, k, v, *args, **kwargs)

    pe = posgpt_pope(dtype=torch.float32)
    assert resolve_backend("auto", pe, torch.device("cpu")) == "sdpa"
    q, k, v, _ = inputs(9, seed=6, dtype=torch.float32)
    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    got, _ = posgpt_attention(pe, q, k, v)
    assert calls == [(2 * D, 2 * D, 2 * D, None, True)] and got.shape == v.shape


def tiny_model(**model_settings) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_embd=32, n_head=2, vocab_size=128, **model_settings)
    model = GPT(cfg, PoPEConfig(phase_bias="uniform"), train_seq_len=16)
    return model.eval()


def test_cached_decoding_equals_a_full_forward():
    model = tiny_model()
    tokens = torch.randint(0, 128, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(tokens)
        cache = KVCache()
        steps = [model(tokens[:, :5], cache=cache)] + [model(tokens[:, t : t + 1], cache=cache) for t in range(5, 20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sink", [False, True])
def test_training_with_randomized_positions_and_a_sink_reaches_the_phase(sink):
    """Per-row positions (B, T) broadcast over the phase's heads; with a sink, training's CPU sink kernel (one head
    size too) equals the written-out attention."""
    model = tiny_model(attn_sink=sink).train()
    tokens = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    positions = torch.stack([torch.sort(torch.randperm(64)[:12]).values for _ in range(2)])
    loss = model(tokens, targets=tokens, positions=positions)
    loss.backward()
    assert model.pe.phase.grad is not None and model.pe.phase.grad.abs().sum() > 0
    assert model.no_weight_decay() == [model.pe.phase]
    with torch.no_grad():
        probs: list = []
        written_out = model(tokens, positions=positions, capture=probs)
        torch.testing.assert_close(model(tokens, positions=positions), written_out, rtol=1e-5, atol=1e-5)


def test_an_unknown_phase_bias_is_refused_at_start_up():
    validate(compose_config(["pe=pope", "pe.phase_bias=none"]))
    refusal = "pe.phase_bias='learned' is not one of its choices: zero, uniform, none"
    with pytest.raises(PosGPTError, match=re.escape(refusal)):
        validate(compose_config(["pe=pope", "pe.phase_bias=learned"]))
