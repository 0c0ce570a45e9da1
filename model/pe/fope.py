"""FoPE: Fourier position embedding (Hua et al. 2025, "Fourier Position Embedding: Enhancing Attention's Periodic
Extension for Length Generalization", ICML 2025).

RoPE turns pair m of a head's q and k by one frequency, t omega_m (rope.py). FoPE makes each pair a Fourier series
over RoPE's frequencies, and clips to zero the frequencies too low to complete a period within the training length
L (too few of their values are trained):

    omega_k = base^(-2k/d), kept where omega_k >= 2 pi / L (k < D); the rest are clipped to 0 and leave the series
    C_hm(t) = sum_{k<D} a_hkm cos(omega_k t),      S_hm(t) = sum_{k<D} b_hkm sin(omega_k t),      m < M = min(D, d/4)
    C_hm(t) = 1,  S_hm(t) = 0                                                   M <= m < d/2 (the frequency 0)
    q'_t[m] = q_t[m] C_hm(t) - q_t[m + d/2] S_hm(t),      q'_t[m + d/2] = q_t[m + d/2] C_hm(t) + q_t[m] S_hm(t)

and k the same way, with the same C and S, per head h. Pairs are (m, m + d/2), as in rope.py. The coefficients
start at a "step identity" plus noise,

    a, b = E + N(0, s^2),   E_km = 1 where k = m ceil(D/M) (< D), else 0,   s = sigma sqrt(2 / (M (D + H)))

(s is torch's xavier_normal_ of an (H, D, M) tensor with gain sigma), so pair m starts on its dominant frequency
omega_(m ceil(D/M)) with a little of every other kept one; sigma = 0 is RoPE with its clipped frequencies (and, where
D > d/4, only M pairs turning). a and b are fixed unless ``learn_coefficients`` (then they are learned and not
weight-decayed); fixed, they are buffers saved with the checkpoint, since they are random draws.

Checked against the paper's reference code, TsinghuaC3I/Fourier-Position-Embedding (olmo/model.py:
``FourierEmbedding``, and ``RotaryEmbedding`` for the frequencies; olmo/config.py for the defaults; the
configs/*/ce-fourier/*.yaml runs): the clip is ``rope_clamp_floor_freq`` with ``rope_clamp_floor_to_zero`` at
floor 2 pi / ``max_sequence_length`` (ratio 1, a strict ``<``); the zero frequencies are dropped from the series
(``fourier_ignore_zero``); M = min(D, head_dim // 4); cos and sin have their own coefficients
(``fourier_separate_basis``), one set per head (``fourier_separate_head``, an (H, D, M) tensor), initialised as
above (``fourier_init: eye_xavier_norm``, ``get_step_eye``) with gain 0.3, 0.4 and 0.6 for its 60M, 180M and 1.2B
models (sigma's default is the smallest's), and not learned (``fourier_learnable`` defaults to false and no config
sets it). Two deliberate differences:

- the constant pairs M <= m < d/2 get cos 1 and sin 0 here, the frequency 0 the paper clips to; the reference pads
  both its cos and its sin with 1 (``F.pad(..., value=1)``), which maps such a pair to (x1 - x2, x2 + x1), sqrt 2
  times a fixed turn by 45 degrees: the same for every position, but twice q . k on those pairs;
- one set of coefficients serves every layer; the reference draws a set per layer (each block holds its own
  ``FourierEmbedding``). ``Rotation.rotate`` is not told its layer, and a per-layer pattern (hybrid.py) runs one
  scheme object in all of its layers, so per-layer coefficients would need the layer passed to ``rotate``.

L is ``clip_length``, the training length when unset; a run fine-tuned from another (``train.init_from``) takes its
parent's, so that its coefficients keep their shapes. C and S depend on the positions only: ``prepare`` computes
them once per forward pass (angles in float64, as rope.py's), and every layer applies them.
"""

from __future__ import annotations

import dataclasses
import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core.domain import domain
from core.errors import PosGPTError
from model.pe.base import ModelDims, PEConfig, PositionalEncoding
from model.pe.capabilities import Rotation
from model.pe.rope import rotate_pairs
from model.pe.rope_scaling import rope_inv_freq


@dataclass
class FoPEConfig(PEConfig):
    name: str = "fope"
    base: float = domain(10000.0, gt=1)  # omega_k = base^(-2k/d), RoPE's frequencies
    sigma: float = domain(0.3, ge=0)  # gain of the coefficients' noise around the step identity (0: clipped RoPE)
    learn_coefficients: bool = False  # true: a and b are learned (the reference's fourier_learnable)
    # L: frequencies whose period exceeds L are clipped to zero; None: train.seq_len (set from the parent by
    # train.init_from)
    clip_length: int | None = domain(None, ge=1)


def kept_frequencies(head_dim: int, base: float, length: int) -> torch.Tensor:
    """The frequencies omega_k = base^(-2k/d) whose period 2 pi / omega_k fits within ``length`` tokens (omega_k >=
    2 pi / length), float64, highest first; the others are clipped to zero. Counted on the host: the model may be
    built on the meta device (a memory estimate), where a tensor cannot select its own elements."""
    n_kept = sum(base ** (-2 * k / head_dim) >= 2 * math.pi / length for k in range(head_dim // 2))
    return rope_inv_freq(head_dim, base)[:n_kept]


def fourier_pairs(n_kept: int, head_dim: int) -> int:
    """M = min(D, d/4): the pairs of a head that carry a Fourier series (the reference's output dimension)."""
    return min(n_kept, head_dim // 4)


def step_identity(n_kept: int, n_pairs: int) -> torch.Tensor:
    """E, (D, M): pair m starts on frequency m ceil(D/M) where that is one of the D (the identity where D = M; a
    last pair past them starts from the noise alone, as the reference's ``get_step_eye`` leaves it)."""
    eye = torch.zeros(n_kept, n_pairs)
    step = math.ceil(n_kept / n_pairs) if n_pairs else 0
    for m in range(n_pairs):
        if m * step < n_kept:
            eye[m * step, m] = 1.0
    return eye


def fourier_coefficients(n_head: int, n_kept: int, n_pairs: int, sigma: float) -> torch.Tensor:
    """(H, D, M) coefficients E + N(0, s^2), s = sigma sqrt(2 / (M (D + H))): the std torch's xavier_normal_ gives
    an (H, D, M) tensor (fan_in D M, fan_out H M) with gain sigma, as the reference initialises them."""
    noise = torch.randn(n_head, n_kept, n_pairs)
    std = sigma * math.sqrt(2.0 / (n_pairs * (n_kept + n_head))) if n_pairs else 0.0
    return step_identity(n_kept, n_pairs) + noise * std


def check_even_head(head_dim: int) -> None:
    if head_dim % 2:
        raise PosGPTError(
            f"pe=fope turns pairs of coordinates, so the head dimension must be even; "
            f"n_embd/n_head = {head_dim}. Change model.n_embd or model.n_head."
        )


class FourierPositionalEncoding(Rotation, PositionalEncoding):
    name = "fope"
    config_class = FoPEConfig

    def __init__(self, cfg: FoPEConfig, dims: ModelDims) -> None:
        super().__init__(cfg, dims)
        check_even_head(dims.head_dim)
        kept = kept_frequencies(dims.head_dim, cfg.base, cfg.clip_length or dims.train_seq_len)
        self.n_pairs = fourier_pairs(kept.numel(), dims.head_dim)
        self.register_buffer("frequencies", kept, persistent=False)
        cos_coef = fourier_coefficients(dims.n_head, kept.numel(), self.n_pairs, cfg.sigma)
        sin_coef = fourier_coefficients(dims.n_head, kept.numel(), self.n_pairs, cfg.sigma)
        if cfg.learn_coefficients:
            self.cos_coef, self.sin_coef = nn.Parameter(cos_coef), nn.Parameter(sin_coef)
        else:  # random draws: saved with the checkpoint, so that a loaded model turns q and k as the trained one
            self.register_buffer("cos_coef", cos_coef)
            self.register_buffer("sin_coef", sin_coef)

    @classmethod
    def check_model(cls, cfg: FoPEConfig, dims: ModelDims) -> None:
        check_even_head(dims.head_dim)

    @classmethod
    def inherit(cls, cfg: FoPEConfig, parent: FoPEConfig, parent_seq_len: int) -> FoPEConfig:
        """A fine-tuned child clips at its parent's L, so that it keeps the parent's frequencies and coefficients."""
        if cfg.clip_length is not None:
            return cfg
        return dataclasses.replace(cfg, clip_length=parent.clip_length or parent_seq_len)

    def no_weight_decay(self) -> list[nn.Parameter]:
        # decay would pull the coefficients towards zero, away from the identity they start at
        return [self.cos_coef, self.sin_coef] if self.cfg.learn_coefficients else []

    def prepare(self, positions: torch.Tensor, seq_len: int, memo: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """C and S of every head at the positions, each repeated for both coordinates of its pair: (H, T, d) for (T,)
        positions, (B, H, T, d) for (B, T), in the coefficients' dtype (float32 whatever autocast says)."""
        frequencies = self.frequencies.to(positions.device, torch.float64)
        angles = positions.to(torch.float64)[..., None] * frequencies  # (..., T, D)
        dtype = self.cos_coef.dtype
        # the sums in the coefficients' dtype: autocast would take them to bf16. Asked with is_autocast_enabled, which
        # dynamo traces (torch 2.11's cannot trace is_autocast_available); the meta device has no autocast to ask.
        device = positions.device.type
        autocast_on = device != "meta" and torch.is_autocast_enabled(device)
        full = torch.autocast(device, enabled=False) if autocast_on else nullcontext()
        with full:
            cos = torch.einsum("...tk,hkm->...htm", angles.cos().to(dtype), self.cos_coef)
            sin = torch.einsum("...tk,hkm->...htm", angles.sin().to(dtype), self.sin_coef)
        constant = self.dims.head_dim // 2 - self.n_pairs  # pairs at the frequency 0: cos 1, sin 0
        cos, sin = F.pad(cos, (0, constant), value=1.0), F.pad(sin, (0, constant), value=0.0)
        return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, seq_len: int, prepared: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = prepared if prepared is not None else self.prepare(positions, seq_len, {})
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        d = q.shape[-1]
        return rotate_pairs(q, cos, sin, d), rotate_pairs(k, cos, sin, d)

    def extra_repr(self) -> str:
        kept, pairs = self.frequencies.numel(), self.dims.head_dim // 2
        return f"{super().extra_repr()}, kept_frequencies={kept} of {pairs}, fourier_pairs={self.n_pairs}"
