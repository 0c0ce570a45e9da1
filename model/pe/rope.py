"""RoPE: rotary position embedding of queries and keys (Su et al. 2021, "RoFormer", eq. 34).

Each pair of coordinates of q and k is rotated by an angle proportional to the position:

    q'_m = R(m theta) q_m,   k'_n = R(n theta) k_n,   theta_i = base^(-2i/d),  i = 0 .. d/2 - 1

so q'_m . k'_n = q_m^T R((n - m) theta) k_n depends on positions only through the offset n - m. Applied per
head in every layer; values are not rotated. Coordinates are paired as (i, i + d/2) (GPT-NeoX / Hugging
Face layout) rather than (2i, 2i+1): a fixed permutation of the head dimensions, so the same function.

``scaling`` stretches the frequencies for evaluation beyond the training length (see rope_scaling.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from core.errors import PosGPTError
from model.pe.base import ModelDims, PEConfig, PositionalEncoding
from model.pe.rope_scaling import ROPE_SCALINGS, RoPEScalingConfig, check_scaling, rope_inv_freq


@dataclass
class RoPEConfig(PEConfig):
    name: str = "rope"
    base: float = 10000.0
    scaling: RoPEScalingConfig = field(default_factory=RoPEScalingConfig)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class RotaryPositionalEncoding(PositionalEncoding):
    name = "rope"
    config_class = RoPEConfig

    def __init__(self, cfg: RoPEConfig, dims: ModelDims) -> None:
        super().__init__(cfg, dims)
        if dims.head_dim % 2:
            raise PosGPTError(
                f"pe=rope rotates pairs of coordinates, so the head dimension must be even; "
                f"n_embd/n_head = {dims.head_dim}. Change model.n_embd or model.n_head."
            )
        self.register_buffer("inv_freq", rope_inv_freq(dims.head_dim, cfg.base), persistent=False)
        self.set_scaling(cfg.scaling)

    def set_scaling(self, scaling: RoPEScalingConfig) -> None:
        """Extend the context with another method from now on (evaluation compares several on one model)."""
        check_scaling(scaling)
        self.cfg = dataclasses.replace(self.cfg, scaling=scaling)

    def rotation_depends_on_length(self) -> bool:
        return self.cfg.scaling.type == "dynamic_ntk"

    def cos_sin(self, positions: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(T,) positions -> cos, sin of shape (T, head_dim) for a sequence of seq_len keys."""
        scale = ROPE_SCALINGS[self.cfg.scaling.type]
        inv_freq, attention_factor = scale(
            self.inv_freq, self.cfg.scaling, self.cfg.base, self.dims.head_dim, self.dims.train_seq_len, seq_len
        )
        # Angles in float64: m * theta_i loses ~1e-3 rad in float32 at m ~ 16K.
        angles = positions.to(torch.float64)[:, None] * inv_freq.to(positions.device)[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        return (angles.cos() * attention_factor).float(), (angles.sin() * attention_factor).float()

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, seq_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos_sin(positions, seq_len)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
