"""xPos: RoPE with an exponential decay per coordinate pair (Sun et al. 2022, "A Length-Extrapolatable
Transformer", eq. 7).

RoPE rotates pair i of q and k by m theta_i (see rope.py); xPos also scales it, the query up and the key down:

    q'_n = zeta^(n / gamma) * R(n theta) q_n,    k'_m = zeta^(-m / gamma) * R(m theta) k_m,
    zeta_i = (2i / d + 0.4) / 1.4  in (0.29, 1),   gamma = scale_base (512)

so q'_n . k'_m = sum_i zeta_i^((n - m) / gamma) (...): pair i's contribution decays with the distance
n - m, the fastest-turning pairs (small zeta_i) the most. Values are not scaled.

Overflow. zeta_0^(n / gamma) is e^(-1.25 n / 512): at n = 16K, e^(-40) for q and e^(+40) for k, and past
n ~ 36K beyond float32's range. Only n - m matters, so like the reference code (microsoft/torchscale,
``XPOS``, which centres the positions of the sequence around 0) both q and k use n - c, m - c with c the
middle of the positions of the forward pass; during cached decoding c stays the one chosen for the prompt
(kept in the cache), so cached keys and new queries agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from core.domain import domain
from core.errors import PosGPTError
from model.pe.base import ModelDims, PEConfig, PositionalEncoding
from model.pe.capabilities import Rotation
from model.pe.rope import rotate_pairs, rotation_angles
from model.pe.rope_scaling import rope_inv_freq


@dataclass
class XPosConfig(PEConfig):
    name: str = "xpos"
    base: float = domain(10000.0, gt=1)  # rotation frequencies, as RoPE's
    scale_base: float = domain(512.0, gt=0)  # gamma: the decay's length scale


def xpos_zeta(head_dim: int) -> torch.Tensor:
    """zeta_i = (2i / d + 0.4) / 1.4 for the pairs i = 0 .. d/2 - 1, in float64."""
    return (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim + 0.4) / 1.4


class XPosPositionalEncoding(Rotation, PositionalEncoding):
    name = "xpos"
    config_class = XPosConfig

    def __init__(self, cfg: XPosConfig, dims: ModelDims) -> None:
        super().__init__(cfg, dims)
        if dims.head_dim % 2:
            raise PosGPTError(
                f"pe=xpos rotates pairs of coordinates, so the head dimension must be even; "
                f"n_embd/n_head = {dims.head_dim}. Change model.n_embd or model.n_head."
            )
        self.register_buffer("inv_freq", rope_inv_freq(dims.head_dim, cfg.base), persistent=False)
        self.register_buffer("log_zeta", xpos_zeta(dims.head_dim).log(), persistent=False)

    def prepare(self, positions: torch.Tensor, seq_len: int, memo: dict) -> tuple[torch.Tensor, ...]:
        """cos and sin times the query scale zeta^((n - c) / gamma), then times the key scale (its inverse); float32."""
        centre = memo.setdefault("xpos_centre", (positions.amin() + positions.amax()).to(torch.float64) / 2)
        angles = rotation_angles(positions, self.inv_freq)
        log_zeta = torch.cat((self.log_zeta, self.log_zeta)).to(positions.device)
        exponent = (positions.to(torch.float64) - centre)[..., None] / self.cfg.scale_base
        if exponent.dim() == 3:
            exponent = exponent[:, None]
        q_scale = (exponent * log_zeta).exp()
        k_scale = q_scale.reciprocal()
        cos, sin = angles.cos(), angles.sin()
        return tuple(t.float() for t in (cos * q_scale, sin * q_scale, cos * k_scale, sin * k_scale))

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, seq_len: int, prepared: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q_cos, q_sin, k_cos, k_sin = (t.to(q.dtype) for t in (prepared or self.prepare(positions, seq_len, {})))
        d = q.shape[-1]
        return rotate_pairs(q, q_cos, q_sin, d), rotate_pairs(k, k_cos, k_sin, d)
