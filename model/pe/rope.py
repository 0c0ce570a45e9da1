"""RoPE: rotary position embedding of queries and keys (Su et al. 2021, "RoFormer", eq. 34).

Each pair of coordinates of q and k is rotated by an angle proportional to the position:

    q'_m = R(m theta) q_m,   k'_n = R(n theta) k_n,   theta_i = base^(-2i/d),  i = 0 .. d/2 - 1

so q'_m . k'_n = q_m^T R((n - m) theta) k_n depends on positions only through the offset n - m. Applied per
head in every layer; values are not rotated. Coordinates are paired as (i, i + d/2) (GPT-NeoX / Hugging
Face layout) rather than (2i, 2i+1): a fixed permutation of the head dimensions, so the same function.

``scaling`` stretches the frequencies for evaluation beyond the training length (see rope_scaling.py); ``remap``
keeps the distances within a window and remaps those beyond it (Self-Extend, ReRoPE, STRING: see rope_remap.py).
Both are RoPE's evaluation-time variations (``eval.variations=[none,yarn:8,self_extend:4:32,rerope:32,string:32:4]``,
model/pe/base.py), one at a time.

Partial rotary (``rotary_fraction`` f < 1; GPT-NeoX's ``rotary_pct``, litgpt's ``rotary_percentage``): only
the first r = f d coordinates of each head are rotated, with the frequencies of an r-dimensional RoPE
(theta_i = base^(-2i/r)); the other d - r pass through unchanged. Scalings act on those r coordinates.

cos and sin depend on the positions only, not on the layer: ``prepare`` computes them once per forward pass.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from core.domain import domain
from core.errors import PosGPTError
from model.pe.base import ModelDims, PEConfig, PositionalEncoding
from model.pe.capabilities import Rotation
from model.pe.rope_remap import (
    RoPERemapConfig,
    check_remap,
    far_positions,
    parse_remap,
    remap_attention_factor,
    remap_label,
    resolved,
)
from model.pe.rope_scaling import (
    LENGTH_DEPENDENT,
    ROPE_SCALINGS,
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
    base: float = domain(10000.0, gt=1)  # theta_i = base^(-2i/d)
    rotary_fraction: float = domain(1.0, gt=0, le=1)  # share of each head's dimensions that is rotated
    scaling: RoPEScalingConfig = field(default_factory=RoPEScalingConfig)
    remap: RoPERemapConfig = field(default_factory=RoPERemapConfig)  # Self-Extend, ReRoPE, STRING (rope_remap.py)


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
    """How many leading coordinates of a head RoPE rotates: head_dim * fraction, a whole even number >= 2 (a
    fraction of a coordinate is refused, never rounded, as p-RoPE's fraction of pairs is)."""
    if fraction == 1.0 and head_dim % 2:
        raise PosGPTError(
            f"pe=rope rotates pairs of coordinates, so the head dimension must be even; "
            f"n_embd/n_head = {head_dim}. Change model.n_embd or model.n_head."
        )
    rotated = round(head_dim * fraction)
    if not math.isclose(rotated, head_dim * fraction, abs_tol=1e-9) or rotated < 2 or rotated % 2:
        raise PosGPTError(
            f"pe=rope rotates pairs of coordinates, so head_dim x pe.rotary_fraction must be an even number >= 2; "
            f"n_embd/n_head = {head_dim}, x {fraction} = {head_dim * fraction:g}. "
            "Change model.n_embd, model.n_head or pe.rotary_fraction."
        )
    return rotated


class RotaryPositionalEncoding(Rotation, PositionalEncoding):
    name = "rope"
    config_class = RoPEConfig
    # context extension (rope_scaling.py, rope_remap.py) is applied at evaluation time
    eval_time_settings = ("scaling", "remap")

    def __init__(self, cfg: RoPEConfig, dims: ModelDims) -> None:
        super().__init__(cfg, dims)
        self.rotated = rotated_dims(dims.head_dim, cfg.rotary_fraction)
        self.register_buffer("inv_freq", rope_inv_freq(self.rotated, cfg.base), persistent=False)
        self.set_scaling(cfg.scaling)
        self.set_remap(cfg.remap)

    @classmethod
    def check_model(cls, cfg: RoPEConfig, dims: ModelDims) -> None:
        rotated_dims(dims.head_dim, cfg.rotary_fraction)  # at start-up, not when the model is built

    def set_scaling(self, scaling: RoPEScalingConfig) -> None:
        """Extend the context with another method from now on (evaluation compares several on one model)."""
        check_scaling(scaling)
        check_scaling_fits(scaling, self.rotated)
        check_one_extension(scaling, self.cfg.remap)
        self.cfg = dataclasses.replace(self.cfg, scaling=scaling)
        self.settings_changed()  # a length-dependent scaling keeps a KV cache's keys unrotated

    def set_remap(self, remap: RoPERemapConfig) -> None:
        """Remap the distances beyond a window (or stop: type none) from now on."""
        check_remap(remap, train_len=self.dims.train_seq_len)
        check_one_extension(self.cfg.scaling, remap)
        self.cfg = dataclasses.replace(self.cfg, remap=resolved(remap))
        self.settings_changed()  # a remap takes the windowed path

    @classmethod
    def check_variations(cls, cfg: RoPEConfig, specs: Sequence[str]) -> None:
        """eval.variations are scalings (``yarn:8``) or remaps (``rerope:32``) of a run configured with neither; a
        scaling and a remap never go together; an attention factor needs a type that uses it (YaRN's temperature,
        LongRoPE's factor: core.domain.check_used, with the variations' types)."""
        check_remap(cfg.remap)
        check_one_extension(cfg.scaling, cfg.remap)
        if specs and (cfg.scaling.type != "none" or cfg.remap.type != "none"):
            raise PosGPTError(
                "set either pe.scaling.type or pe.remap.type (one extension) or eval.variations (several), not both"
            )
        for spec in specs:
            cls.parse_variation(spec, cfg)

    @classmethod
    def parse_variation(cls, spec: str, cfg: RoPEConfig) -> dict[str, Any]:
        """``yarn:8`` -> that scaling, with the yarn betas and temperature of the run's ``pe.scaling``;
        ``self_extend:4:32``, ``rerope:32``, ``string:32:4`` -> that remap (rope_remap.py)."""
        remap = parse_remap(spec)
        if remap is not None:
            return {"remap": remap}
        return {"scaling": parse_scaling(spec, defaults=cfg.scaling)}

    @classmethod
    def variation_label(cls, settings: dict[str, Any]) -> str:
        label = scaling_label(settings.get("scaling"))
        labels = ("" if label == "none" else label, remap_label(settings.get("remap")))
        return " ".join(label for label in labels if label)  # neither: the run as trained, unlabelled

    def settings(self) -> dict[str, Any]:
        """Without a remap, the scaling alone: a run evaluated as configured is the measurement it was before
        remaps existed (evaluation/results.py's row_key compares the settings)."""
        settings = super().settings()
        if settings["remap"].type == "none":
            del settings["remap"]
        return settings

    def eval_variations(self, specs: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
        """As the base class, with each remap checked against this model's training length before any is
        evaluated."""
        variations = super().eval_variations(specs)
        for label, settings in variations:
            if "remap" in settings:
                where = f"eval.variations entry {label!r}"
                check_remap(settings["remap"], train_len=self.dims.train_seq_len, where=where)
        return variations

    @classmethod
    def inherit(cls, cfg: RoPEConfig, parent: RoPEConfig, parent_seq_len: int) -> RoPEConfig:
        """A scaled child keeps the length L its parent's frequencies were learned at (rope_scaling.py): the
        parent's own ``original_seq_len``, else its training length. A remap takes nothing from the parent: its
        window and group are distances in tokens, whatever length the weights were trained at (the window must be
        shorter than the child's own train.seq_len)."""
        if cfg.scaling.type == "none" or cfg.scaling.original_seq_len is not None:
            return cfg
        original = parent.scaling.original_seq_len or parent_seq_len
        return dataclasses.replace(cfg, scaling=dataclasses.replace(cfg.scaling, original_seq_len=original))

    def apply_eval_setting(self, name: str, value: Any) -> None:
        if name == "remap":
            self.set_remap(value)
        else:
            self.set_scaling(value)

    def score_window(self) -> int | None:
        return None if self.cfg.remap.type == "none" else self.cfg.remap.window

    def rotation_depends_on_length(self) -> bool:
        return self.cfg.scaling.type in LENGTH_DEPENDENT

    def frequencies(self, seq_len: int) -> tuple[torch.Tensor, float]:
        """The frequencies theta'_i of the r/2 rotated pairs under the scaling, for a sequence of seq_len keys, and
        the attention factor that multiplies cos and sin."""
        scale = ROPE_SCALINGS[self.cfg.scaling.type]
        original_len = self.cfg.scaling.original_seq_len or self.dims.train_seq_len  # L (see rope_scaling.py)
        inv_freq, factor = scale(self.inv_freq, self.cfg.scaling, self.cfg.base, self.rotated, original_len, seq_len)
        return inv_freq, factor * remap_attention_factor(self.cfg.remap)  # a remap comes without a scaling

    def cos_sin(self, positions: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(T,) or (B, T) positions -> cos, sin of shape (T, r) or (B, 1, T, r), r the rotated dimensions, for a
        sequence of seq_len keys."""
        inv_freq, attention_factor = self.frequencies(seq_len)
        angles = rotation_angles(positions, inv_freq)
        return (angles.cos() * attention_factor).float(), (angles.sin() * attention_factor).float()

    def prepare(self, positions: torch.Tensor, seq_len: int, memo: dict) -> Any:
        """cos and sin at the positions; with a remap, also at the far positions of queries and of keys."""
        if self.cfg.remap.type == "none":
            return self.cos_sin(positions, seq_len)
        far_query, far_key = far_positions(self.cfg.remap, positions)
        return self.cos_sin(positions, seq_len), self.cos_sin(far_query, seq_len), self.cos_sin(far_key, seq_len)

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, seq_len: int, prepared: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k rotated to their positions; with a remap, each with its far rotation beside it on the last
        dimension, (near, far) (rope_remap.py)."""
        prepared = prepared if prepared is not None else self.prepare(positions, seq_len, {})
        if self.cfg.remap.type == "none":
            return self._rotate(q, prepared), self._rotate(k, prepared)
        near, far_query, far_key = prepared
        q = torch.cat((self._rotate(q, near), self._rotate(q, far_query)), dim=-1)
        return q, torch.cat((self._rotate(k, near), self._rotate(k, far_key)), dim=-1)

    def _rotate(self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        cos, sin = cos_sin
        return rotate_pairs(x, cos.to(x.dtype), sin.to(x.dtype), self.rotated)


def check_one_extension(scaling: RoPEScalingConfig, remap: RoPERemapConfig) -> None:
    """PosGPTError when a scaling and a remap are both set: each maps RoPE's positions beyond the training length
    on its own (rescaled frequencies, remapped distances); their combination is neither method."""
    if scaling.type != "none" and remap.type != "none":
        raise PosGPTError(
            f"pe.scaling.type={scaling.type} and pe.remap.type={remap.type} both extend RoPE's context: "
            "choose one (compare them with eval.variations)"
        )
