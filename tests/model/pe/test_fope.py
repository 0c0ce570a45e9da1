"""FoPE: the clip of the low frequencies, the coefficients' initialisation and the Fourier rotation, against the
module docstring's equation and an independent transcription of the reference code's formulation
(TsinghuaC3I/Fourier-Position-Embedding, olmo/model.py, ``RotaryEmbedding.get_inv_freq`` and ``FourierEmbedding``)."""

import math

import pytest
import torch
import torch.nn.functional as F

from core.errors import PosGPTError
from model import GPT
from model.gpt import ModelConfig
from model.pe import SCHEMES, ModelDims
from model.pe.fope import FoPEConfig
from model.pe.p_rope import PRoPEConfig

# head_dim 16, L = 64: omega_k = 10^(-k/2) >= 2 pi / 64 for k = 0, 1, 2, so D = 3 <= d/4 = 4 and M = 3
DIMS = ModelDims(n_embd=32, n_head=2, head_dim=16, train_seq_len=64, init_std=0.02, n_layer=2)
# head_dim 16, L = 4096: D = 6 > d/4 = 4, so M = 4 pairs mix all six (step ceil(6/4) = 2)
LONG = ModelDims(n_embd=32, n_head=2, head_dim=16, train_seq_len=4096, init_std=0.02, n_layer=2)


def fope(dims=DIMS, **settings):
    torch.manual_seed(0)
    return SCHEMES["fope"](FoPEConfig(**settings), dims)


def reference_frequencies(head_dim, base, max_sequence_length):
    """``get_inv_freq`` with rope_clamp_floor_freq and rope_clamp_floor_to_zero (floor ratio 1), then
    fourier_ignore_zero: float32 frequencies, those below 2 pi / L set to 0 and dropped."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    inv_freq[inv_freq < 2 * torch.pi / max_sequence_length] = 0.0
    return inv_freq[inv_freq != 0.0]


def reference_rotate(x, sin_coef, cos_coef, inv_freq, head_dim, sin_pad):
    """The reference's forward for prefix "attn" with separate bases and heads, positions 0..T-1: pos = arange(T)
    times the frequencies, einsum "bhtD,hDd->bhtd" with each basis, both padded to head_dim // 2 (the reference pads
    sin with ``sin_pad`` = 1; cos with 1), repeated, then t * cos + rotate_half(t) * sin with the halves of a
    (B, nh, T, 2, hs // 2) view."""
    B, nh, T, hs = x.shape
    freqs = torch.einsum("t, hd -> htd", torch.arange(T, dtype=torch.float), inv_freq[None, :])[None]
    pos_sin, pos_cos = freqs.sin(), freqs.cos()
    fourier_sin = torch.einsum("bhtD, hDd -> bhtd", pos_sin, sin_coef)
    fourier_cos = torch.einsum("bhtD, hDd -> bhtd", pos_cos, cos_coef)
    fourier_sin = F.pad(fourier_sin, (0, head_dim // 2 - fourier_sin.size(-1)), mode="constant", value=sin_pad)
    fourier_cos = F.pad(fourier_cos, (0, head_dim // 2 - fourier_cos.size(-1)), mode="constant", value=1)
    fourier_sin, fourier_cos = torch.cat((fourier_sin,) * 2, dim=-1), torch.cat((fourier_cos,) * 2, dim=-1)
    x1, x2 = x.view(B, nh, T, 2, hs // 2).unbind(dim=-2)
    return x * fourier_cos + torch.cat((-x2, x1), dim=-1) * fourier_sin


@pytest.mark.parametrize("head_dim, length", [(16, 64), (16, 4096), (64, 512), (64, 2048), (32, 7)])
def test_the_frequencies_with_a_period_beyond_the_training_length_are_clipped_as_in_the_reference(head_dim, length):
    dims = ModelDims(n_embd=2 * head_dim, n_head=2, head_dim=head_dim, train_seq_len=length, init_std=0.02)
    pe = fope(dims)
    want = reference_frequencies(head_dim, 10000.0, length)
    torch.testing.assert_close(pe.frequencies.float(), want, rtol=1e-6, atol=0)
    assert (2 * math.pi / pe.frequencies <= length).all()  # every kept period fits within L
    assert pe.n_pairs == min(len(want), head_dim // 4)
    assert pe.cos_coef.shape == pe.sin_coef.shape == (2, len(want), pe.n_pairs)  # per head: (H, D, M)


def test_the_coefficients_start_at_the_step_identity_plus_xavier_noise():
    pe = fope(LONG, sigma=0.0)
    eye = torch.zeros(6, 4)
    eye[[0, 2, 4], [0, 1, 2]] = 1.0  # pair m on frequency 2m (ceil(6 / 4) = 2); pair 3's would be the 7th of 6
    assert torch.equal(pe.cos_coef, eye.expand(2, 6, 4)) and torch.equal(pe.sin_coef, eye.expand(2, 6, 4))
    assert torch.equal(fope(sigma=0.0).cos_coef[0], torch.eye(3))  # D = M: the identity
    # the noise's std is torch's xavier_normal_ of an (H, D, M) tensor with gain sigma: sigma sqrt(2 / (M (D + H)))
    wide = ModelDims(n_embd=8 * 64, n_head=8, head_dim=64, train_seq_len=512, init_std=0.02)
    pe = fope(wide, sigma=0.3)
    reference = torch.empty(8, 16, 16)
    torch.nn.init.xavier_normal_(reference, gain=0.3)
    for coef in (pe.cos_coef, pe.sin_coef):
        noise = coef - torch.eye(16)
        assert noise.std().item() == pytest.approx(reference.std().item(), rel=0.1)
        assert noise.std().item() == pytest.approx(0.3 * math.sqrt(2 / (16 * (16 + 8))), rel=0.1)
        assert abs(noise.mean().item()) < 0.003
    assert not torch.equal(pe.cos_coef, pe.sin_coef) and not torch.equal(pe.cos_coef[0], pe.cos_coef[1])


@pytest.mark.parametrize("dims", [DIMS, LONG], ids=["D<=d/4", "D>d/4"])
def test_rotation_is_the_fourier_series_of_the_docstring(dims):
    pe = fope(dims, sigma=0.5)
    T, d, M = 11, dims.head_dim, pe.n_pairs
    q, k = torch.randn(2, 2, T, d, dtype=torch.float64), torch.randn(2, 2, T, d, dtype=torch.float64)
    positions = torch.arange(T)
    got_q, got_k = pe.rotate(q.float(), k.float(), positions, T)
    omega = pe.frequencies
    a, b = pe.cos_coef.double(), pe.sin_coef.double()
    for h in range(2):
        for t in (0, 3, 10):
            for m in range(d // 2):
                if m < M:
                    C = sum(a[h, j, m] * math.cos(omega[j] * t) for j in range(len(omega)))
                    S = sum(b[h, j, m] * math.sin(omega[j] * t) for j in range(len(omega)))
                else:
                    C, S = 1.0, 0.0
                for x, got in ((q, got_q), (k, got_k)):
                    first = x[:, h, t, m] * C - x[:, h, t, m + d // 2] * S
                    second = x[:, h, t, m + d // 2] * C + x[:, h, t, m] * S
                    torch.testing.assert_close(got[:, h, t, m].double(), first, rtol=1e-5, atol=1e-6)
                    torch.testing.assert_close(got[:, h, t, m + d // 2].double(), second, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dims", [DIMS, LONG], ids=["D<=d/4", "D>d/4"])
def test_rotation_equals_the_reference_formulation_except_its_sin_padding(dims):
    pe = fope(dims, sigma=0.3)
    T, d, M = 20, dims.head_dim, pe.n_pairs
    q = torch.randn(3, 2, T, d)
    ours, _ = pe.rotate(q, q, torch.arange(T), T)
    inv_freq = reference_frequencies(d, 10000.0, dims.train_seq_len)
    with_zero = reference_rotate(q, pe.sin_coef, pe.cos_coef, inv_freq, d, sin_pad=0)
    torch.testing.assert_close(ours, with_zero, rtol=1e-5, atol=1e-6)
    # The reference's own padding, sin 1 on the constant pairs: the Fourier pairs agree, the constant pairs get
    # (x1 - x2, x2 + x1), so q' . k' there is twice q . k; a test that could not tell would pass either.
    theirs = reference_rotate(q, pe.sin_coef, pe.cos_coef, inv_freq, d, sin_pad=1)
    fourier = torch.cat((torch.arange(M), torch.arange(M) + d // 2))
    constant = torch.cat((torch.arange(M, d // 2), torch.arange(M, d // 2) + d // 2))
    torch.testing.assert_close(ours[..., fourier], theirs[..., fourier], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ours[..., constant], theirs[..., constant])
    k = torch.randn(3, 2, T, d)
    ours_k = pe.rotate(k, k, torch.arange(T), T)[0]
    theirs_k = reference_rotate(k, pe.sin_coef, pe.cos_coef, inv_freq, d, sin_pad=1)
    products = (ours[..., constant] * ours_k[..., constant]).sum(-1)
    torch.testing.assert_close((theirs[..., constant] * theirs_k[..., constant]).sum(-1), 2 * products)


def test_sigma_zero_is_rope_with_its_clipped_frequencies():
    """Without noise each Fourier pair is one RoPE frequency: p-RoPE keeping the D highest of d/2 (D <= d/4)."""
    pe = fope(sigma=0.0)
    p_rope = SCHEMES["p_rope"](PRoPEConfig(p=3 / 8), DIMS)  # 3 of 8 pairs
    q, k = torch.randn(2, 2, 50, 16), torch.randn(2, 2, 50, 16)
    positions = torch.arange(100, 150)
    for ours, theirs in zip(pe.rotate(q, k, positions, 150), p_rope.rotate(q, k, positions, 150)):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    # with noise it is not: a Fourier series, not one frequency
    assert not torch.allclose(fope(sigma=0.3).rotate(q, k, positions, 150)[0], p_rope.rotate(q, k, positions, 150)[0])


def test_positions_per_row_and_cached_keys_agree_with_the_shared_positions():
    pe = fope(sigma=0.3)
    q, k = torch.randn(2, 2, 9, 16), torch.randn(2, 2, 9, 16)
    shared = pe.rotate(q, k, torch.arange(5, 14), 14)
    per_row = pe.rotate(q, k, torch.arange(5, 14).expand(2, 9), 14)
    for a, b in zip(shared, per_row):
        torch.testing.assert_close(a, b)
    one = pe.rotate(q[:, :, 4:5], k[:, :, 4:5], torch.arange(9, 10), 14)  # a decoding step at position 9
    torch.testing.assert_close(one[1], shared[1][:, :, 4:5])


def test_fixed_coefficients_are_saved_buffers_and_learned_ones_parameters_without_decay():
    fixed = fope()
    assert {"cos_coef", "sin_coef"} <= set(fixed.state_dict()) and not list(fixed.parameters())
    assert fixed.no_weight_decay() == []
    learned = fope(learn_coefficients=True)
    assert {id(p) for p in learned.no_weight_decay()} == {id(learned.cos_coef), id(learned.sin_coef)}
    q = torch.randn(1, 2, 6, 16)
    sum(t.sum() for t in learned.rotate(q, q, torch.arange(6), 6)).backward()
    assert learned.cos_coef.grad.abs().sum() > 0 and learned.sin_coef.grad.abs().sum() > 0


def test_a_fine_tuned_run_clips_at_its_parents_length_and_odd_heads_are_refused():
    child = SCHEMES["fope"].inherit(FoPEConfig(), FoPEConfig(), 64)
    assert child.clip_length == 64
    assert SCHEMES["fope"].inherit(FoPEConfig(), FoPEConfig(clip_length=32), 64).clip_length == 32
    assert SCHEMES["fope"].inherit(FoPEConfig(clip_length=16), FoPEConfig(), 64).clip_length == 16
    longer = ModelDims(n_embd=32, n_head=2, head_dim=16, train_seq_len=512, init_std=0.02)
    assert fope(longer, clip_length=64).frequencies.numel() == fope(DIMS).frequencies.numel()
    odd = ModelDims(n_embd=18, n_head=2, head_dim=9, train_seq_len=64, init_std=0.02)
    with pytest.raises(PosGPTError, match="even"):
        SCHEMES["fope"].check_model(FoPEConfig(), odd)


@pytest.mark.parametrize("learn", [False, True])
def test_a_tiny_model_trains_and_runs_past_its_training_length(learn):
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=61)
    model = GPT(cfg, FoPEConfig(learn_coefficients=learn), train_seq_len=16)
    idx = torch.randint(0, 61, (2, 16))
    loss = model(idx[:, :-1], targets=idx[:, 1:])
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    with torch.no_grad():
        logits = model(torch.randint(0, 61, (1, 128)))  # 8x the training length
    assert logits.shape == (1, 128, 61) and torch.isfinite(logits).all()
