"""PoPE: polar coordinate position embedding (Gopalakrishnan, Csordás, Schmidhuber & Mozer 2025, "Decoupling the
'What' and 'Where' With Polar Coordinate Positional Embeddings", arXiv 2509.10534, sec. 3).

RoPE rotates pairs of q's and k's coordinates, so a pair's own angle (its content) adds to the angle of its position
and the two are entangled in the score. PoPE makes each of a head's d coordinates c a complex number whose
magnitude is the content, made non-negative by a softplus, and whose phase is the position alone:

    q~_tc = softplus(q_tc) e^(i t theta_c),    k~_sc = softplus(k_sc) e^(i (s theta_c + delta_c))
    a_ts  = Re[q~_t^H k~_s] / sqrt(d) = sum_c softplus(q_tc) softplus(k_sc) cos((s - t) theta_c + delta_c) / sqrt(d)
    theta_c = base^(-c / d),  c = 0 .. d - 1  (d frequencies, one per coordinate: RoPE has d/2, one per pair)

so the score depends on the positions through s - t only. delta_c is a learned phase per head and frequency
(``phase_bias``), clamped to [-2 pi, 0] wherever it is used; ``none`` leaves it out (delta = 0). Values are
unchanged.

As real vectors: q and k become [mu cos phi, mu sin phi], 2d coordinates per head, (B, H, T, 2d), so attention's
q . k is Re[q~^H k~]. Attention scales q . k by 1 / sqrt(size of q), here 2d, where the references scale by
1 / sqrt(d): q is multiplied by sqrt(2) (folded into its cos and sin, computed once per forward pass), so every
attention path computes a_ts unchanged. v keeps d coordinates; the fused kernels need one size for q, k and v,
so attention pads v with zeros to 2d and drops them from the output (model/kernels.py), and the causal flash
kernel runs as it does for RoPE (a KV cache keeps the 2d-wide keys).

References (tests/model/pe/test_pope.py compares posgpt with their numbers; both are test-only dependencies): PyPI
``PoPE-pytorch`` (``PoPE``, ``apply_pope_to_qk``, ``flash_attn_with_pope``) and x-transformers'
``polar_pos_emb`` (``PolarEmbedding``, ``apply_polar_pos_emb``). As in both, one phase bias of shape (heads, d)
serves every layer, starts at 0 (``uniform``: U(-2 pi, 0), their ``bias_uniform_init``) and is clamped in the
forward pass (so its gradient is 0 outside [-2 pi, 0]). It is not weight-decayed: a phase, not a weight.

Its cost against RoPE's is in docs/speed.md ("PoPE on CPU").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core.domain import choice, domain
from model.pe.base import ModelDims, PEConfig, PositionalEncoding
from model.pe.capabilities import Rotation

PHASE_BIASES = ("zero", "uniform", "none")


@dataclass
class PoPEConfig(PEConfig):
    name: str = "pope"
    base: float = domain(10000.0, gt=1)  # theta_c = base^(-c/d), one frequency per coordinate of a head
    # delta: zero | uniform (learned, starting at 0 or drawn from U(-2 pi, 0)) | none (no phase bias)
    phase_bias: str = choice("zero", PHASE_BIASES)


def pope_frequencies(head_dim: int, base: float) -> torch.Tensor:
    """theta_c = base^(-c / d) for the d coordinates c = 0 .. d - 1 of a head, float64."""
    return base ** -(torch.arange(head_dim, dtype=torch.float64) / head_dim)


def polar(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """(..., d) -> (..., 2d): the magnitudes softplus(x) at the phases whose cos and sin are given."""
    magnitude = F.softplus(x)
    return torch.cat((magnitude * cos.to(x.dtype), magnitude * sin.to(x.dtype)), dim=-1)


class PolarPositionalEncoding(Rotation, PositionalEncoding):
    name = "pope"
    config_class = PoPEConfig

    def __init__(self, cfg: PoPEConfig, dims: ModelDims) -> None:
        super().__init__(cfg, dims)
        self.check_model(cfg, dims)
        self.register_buffer("theta", pope_frequencies(dims.head_dim, cfg.base), persistent=False)
        self.phase = None
        if cfg.phase_bias != "none":
            self.phase = nn.Parameter(torch.zeros(dims.n_head, dims.head_dim))
            if cfg.phase_bias == "uniform":
                with torch.no_grad():
                    self.phase.uniform_(-2 * math.pi, 0.0)

    def no_weight_decay(self) -> list[nn.Parameter]:
        return [] if self.phase is None else [self.phase]

    def prepare(self, positions: torch.Tensor, seq_len: int, memo: dict) -> tuple[torch.Tensor, ...]:
        """cos and sin of the query phases t theta, times sqrt(2) (see the module docstring), (T, d) or
        (B, 1, T, d); then of the key phases t theta + delta, (H, T, d) or (B, H, T, d) (t theta without a bias).
        Phases in float64 (t theta_c loses ~1e-3 rad in float32 at t ~ 16K), then float32."""
        phases = positions.to(torch.float64)[..., None] * self.theta.to(positions.device)
        if phases.dim() == 3:
            phases = phases[:, None]  # per-row positions broadcast over heads
        root2 = math.sqrt(2.0)
        query = ((phases.cos() * root2).float(), (phases.sin() * root2).float())
        if self.phase is None:
            return (*query, phases.cos().float(), phases.sin().float())
        delta = self.phase.clamp(-2 * math.pi, 0.0).to(torch.float64)[:, None, :]  # (H, 1, d)
        keys = phases + delta
        return (*query, keys.cos().float(), keys.sin().float())

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, seq_len: int, prepared: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k (B, H, T, d) -> their polar forms (B, H, T, 2d) at their positions."""
        q_cos, q_sin, k_cos, k_sin = prepared if prepared is not None else self.prepare(positions, seq_len, {})
        return polar(q, q_cos, q_sin), polar(k, k_cos, k_sin)
