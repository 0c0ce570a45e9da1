"""RoPE: rotary position embedding of queries and keys (Su et al. 2021, "RoFormer", eq. 34).

Each pair of coordinates of q and k is rotated by an angle proportional to the position:

    q'_m = R(m theta) q_m,   k'_n = R(n theta) k_n,   theta_i = base^(-2i/d),  i = 0 .. d/2 - 1

so q'_m . k'_n = q_m^T R((n - m) theta) k_n depends on positions only through the offset n - m. Applied per
head in every layer; values are not rotated. Coordinates are paired as (i, i + d/2) (GPT-NeoX / Hugging
Face layout) rather than (2i, 2i+1): a fixed permutation of the head dimensions, so the same function.

``scaling`` stretches the frequencies for evaluation beyond the training length (see rope_scaling.py); it is
RoPE's evaluation-time variation (``eval.variations=[none,yarn:8]``, model/pe/base.py).

Partial rotary (``rotary_fraction`` f < 1; GPT-NeoX's ``rotary_pct``, litgpt's ``rotary_percentage``): only
the first r = f d coordinates of each head are rotated, with the frequencies of an r-dimensional RoPE
(theta_i = base^(-2i/r)); the other d - r pass through unchanged. Scalings act on those r coordinates.

cos and sin depend on the positions only, not on the layer: ``prepare`` computes them once per forward pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from core.domain import domain
from core.errors import PosGPTError
from model.pe.base import ModelDims, PEConfig, PositionalEncoding
from model.pe.rope_scaling import (
    LENGTH_DEPENDENT,
    ROPE_SCALINGS,
    TYPE_SETTINGS,
    RoPEScalingConfig,
    check_scaling,
    check_scaling_fits,
    parse_scaling,
    rope_inv_freq,
    scaling_label,
)


@dataclass
class RoPEConfig(PEConfig):
    name: str = "rope"
    base: float = domain(10000.0, gt=1)
    rotary_fraction: float = domain(1.0, gt=0, le=1)  # share of each head's dimensions that is rotated
    scaling: RoPEScalingConfig = field(default_factory=RoPEScalingConfig)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def rotation_angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """(T,) or (B, T) positions -> float64 angles m theta_i for both coordinates of each pair, (T, 2 len(inv_freq))
    or (B, 1, T, 2 len(inv_freq)) (per-row positions broadcast over heads)."""
    # float64: m * theta_i loses ~1e-3 rad in float32 at m ~ 16K.
    angles = positions.to(torch.float64)[..., None] * inv_freq.to(positions.device, torch.float64)
    angles = torch.cat((angles, angles), dim=-1)
    return angles[:, None] if angles.dim() == 3 else angles


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotated: int) -> torch.Tensor:
    """Rotate the first ``rotated`` coordinates of x (pairs (i, i + rotated/2)); the rest pass through."""
    if rotated == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    head, tail = x[..., :rotated], x[..., rotated:]
    return torch.cat((head * cos + rotate_half(head) * sin, tail), dim=-1)


def rotated_dims(head_dim: int, fraction: float) -> int:
    """How many leading coordinates of a head RoPE rotates: head_dim * fraction, an even number >= 2."""
    if fraction == 1.0 and head_dim % 2:
        raise PosGPTError(
            f"pe=rope rotates pairs of coordinates, so the head dimension must be even; "
            f"n_embd/n_head = {head_dim}. Change model.n_embd or model.n_head."
        )
    rotated = int(head_dim * fraction)
    if rotated < 2 or rotated % 2:
        raise PosGPTError(
            f"pe=rope rotates pairs of coordinates, so head_dim x pe.rotary_fraction must be an even number >= 2; "
            f"n_embd/n_head = {head_dim}, x {fraction} = {head_dim * fraction:g}. "
            "Change model.n_embd, model.n_head or pe.rotary_fraction."
        )
    return rotated


class RotaryPositionalEncoding(PositionalEncoding):
    name = "rope"
    colour = "#1f77b4"
    config_class = RoPEConfig
    eval_time_settings = ("scaling",)  # context extension (rope_scaling.py) is applied at evaluation time
    study_variations = ("yarn:16", "ntk:16")  # no-fine-tuning extension to the study's longest length (16x)

    def __init__(self, cfg: RoPEConfig, dims: ModelDims) -> None:
        super().__init__(cfg, dims)
        self.rotated = rotated_dims(dims.head_dim, cfg.rotary_fraction)
        self.register_buffer("inv_freq", rope_inv_freq(self.rotated, cfg.base), persistent=False)
        self.set_scaling(cfg.scaling)

    def set_scaling(self, scaling: RoPEScalingConfig) -> None:
        """Extend the context with another method from now on (evaluation compares several on one model)."""
        check_scaling(scaling)
        check_scaling_fits(scaling, self.rotated)
        self.cfg = dataclasses.replace(self.cfg, scaling=scaling)

    @classmethod
    def check_variations(cls, cfg: RoPEConfig, specs: Sequence[str]) -> None:
        """eval.variations are scalings (``yarn:8``) of a run trained without one; an attention factor needs a type
        that uses it (YaRN's temperature, LongRoPE's factor)."""
        if specs and cfg.scaling.type != "none":
            raise PosGPTError("set either pe.scaling.type (one scaling) or eval.variations (several), not both")
        scalings = [cls.parse_variation(spec, cfg)["scaling"] for spec in specs]
        if (
            cfg.scaling.type == "none"
            and cfg.scaling.attention_factor is not None
            and not any(scaling.type in TYPE_SETTINGS["attention_factor"] for scaling in scalings)
        ):
            raise PosGPTError(
                "pe.scaling.attention_factor is YaRN's temperature (or LongRoPE's factor): it needs "
                "pe.scaling.type=yarn or longrope, or such an entry in eval.variations"
            )

    @classmethod
    def parse_variation(cls, spec: str, cfg: RoPEConfig) -> dict[str, Any]:
        """``yarn:8`` -> that scaling, with the yarn betas and temperature of the run's ``pe.scaling``."""
        return {"scaling": parse_scaling(spec, defaults=cfg.scaling)}

    @classmethod
    def variation_label(cls, settings: dict[str, Any]) -> str:
        label = scaling_label(settings.get("scaling"))
        return "" if label == "none" else label  # no scaling: the run as trained, unlabelled like other schemes

    @classmethod
    def inherit(cls, cfg: RoPEConfig, parent: RoPEConfig, parent_seq_len: int) -> RoPEConfig:
        """A scaled child keeps the length L its parent's frequencies were learned at (rope_scaling.py): the
        parent's own ``original_seq_len``, else its training length."""
        if cfg.scaling.type == "none" or cfg.scaling.original_seq_len is not None:
            return cfg
        original = parent.scaling.original_seq_len or parent_seq_len
        return dataclasses.replace(cfg, scaling=dataclasses.replace(cfg.scaling, original_seq_len=original))

    def apply_eval_setting(self, name: str, value: Any) -> None:
        self.set_scaling(value)

    def rotation_depends_on_length(self) -> bool:
        return self.cfg.scaling.type in LENGTH_DEPENDENT

    def frequencies(self, seq_len: int) -> tuple[torch.Tensor, float]:
        """The frequencies theta'_i of the r/2 rotated pairs under the scaling, for a sequence of seq_len keys, and
        the attention factor that multiplies cos and sin."""
        scale = ROPE_SCALINGS[self.cfg.scaling.type]
        original_len = self.cfg.scaling.original_seq_len or self.dims.train_seq_len  # L (see rope_scaling.py)
        return scale(self.inv_freq, self.cfg.scaling, self.cfg.base, self.rotated, original_len, seq_len)

    def cos_sin(self, positions: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(T,) or (B, T) positions -> cos, sin of shape (T, r) or (B, 1, T, r), r the rotated dimensions, for a
        sequence of seq_len keys."""
        inv_freq, attention_factor = self.frequencies(seq_len)
        angles = rotation_angles(positions, inv_freq)
        return (angles.cos() * attention_factor).float(), (angles.sin() * attention_factor).float()

    def prepare(self, positions: torch.Tensor, seq_len: int, memo: dict) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos_sin(positions, seq_len)

    def rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor,
        seq_len: int,
        prepared: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = prepared if prepared is not None else self.cos_sin(positions, seq_len)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        return rotate_pairs(q, cos, sin, self.rotated), rotate_pairs(k, cos, sin, self.rotated)
