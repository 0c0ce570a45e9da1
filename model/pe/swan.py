"""SWAN-GPT (Puvvada et al. 2025, "SWAN-GPT: An Efficient and Scalable Approach for Long-Context Language Modeling",
arXiv:2504.08719): global NoPE layers interleaved with sliding-window RoPE layers, three local layers to one global,

    pe.pattern = [swa_rope, swa_rope, swa_rope, scaled_nope]   (cycled over the layers: model.n_layer >= 4)

with the local layers' window W = L/8 (the paper: 512 at a training length of 4096; here ``pe.swa_rope.window=8`` at
posgpt's default train.seq_len=64), and, at inference beyond the training length L, the global layers' scores scaled
up with the number of keys n a query attends:

    attention_i = softmax_j( s(n_i) q_i . k_j / sqrt(d) ),   s(n) = max(1, ln n / ln L),   n_i = p_i + 1

applied as a scale of the NoPE layers' queries (p_i the query's position: its index among the keys, the cache's in a
streaming evaluation), so s = 1 exactly up to L and training is NoPE's. ``pe.scaled_nope.score_scaling`` switches it
(an evaluation-time setting: ``eval.variations=[score_scaling:on,score_scaling:off]``, or the key itself at
evaluation); result rows record it among the scheme's settings (``scaled_nope.score_scaling``), and tables label the
rows without it ``no score scaling``.

What is implemented is the formula above: the log-n form of Qwen's ``use_logn_attn`` (model/temperature.py's ``logn``,
there applied to every layer). The paper's own expression of its scaling (the base of its logarithm, whether it is
clamped at L, whether it is applied to queries or to the scores) was not checked against its text here.

``scaled_nope`` is NoPE with that scaling, a scheme of its own so that any pattern may hold it; ``swa_rope``
(swa_rope.py) is RoPE within a sliding window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from core.errors import PosGPTError
from model.pe.base import ModelDims, PEConfig, PositionalEncoding
from model.pe.capabilities import Rotation
from model.pe.hybrid import HybridPositionalEncoding

SWITCHES = {"on": True, "off": False}


@dataclass
class ScaledNoPEConfig(PEConfig):
    name: str = "scaled_nope"
    # s(n) = max(1, ln n / ln L) on the queries beyond the training length L; false: NoPE exactly
    score_scaling: bool = True


class ScaledNoPE(Rotation, PositionalEncoding):
    """NoPE whose queries are scaled by s(n) = max(1, ln n / ln L) (module docstring)."""

    name = "scaled_nope"
    config_class = ScaledNoPEConfig
    eval_time_settings = ("score_scaling",)

    @classmethod
    def check_model(cls, cfg: ScaledNoPEConfig, dims: ModelDims) -> None:
        if cfg.score_scaling and dims.train_seq_len < 2:
            raise PosGPTError(
                f"pe.score_scaling divides by ln(train.seq_len), which is 0 at train.seq_len={dims.train_seq_len}; "
                "train at 2 tokens or more, or set pe.score_scaling=false"
            )

    def check_random_positions(self, n_positions: int, setting: str = "train.random_positions") -> None:
        if self.cfg.score_scaling:
            raise PosGPTError(
                f"{setting}={n_positions}: pe.score_scaling counts a query's keys by its position, which "
                "randomized positions would make larger than its keys; train with pe.score_scaling=false (it changes "
                "nothing up to train.seq_len) and evaluate with it on"
            )
        super().check_random_positions(n_positions, setting)

    def prepare(self, positions: torch.Tensor, seq_len: int, memo: dict) -> Any:
        """s(p + 1) for the queries at ``positions``, float64, (T,) or (B, T); None without the scaling."""
        if not self.cfg.score_scaling:
            return None
        keys = positions.to(torch.float64) + 1
        return (keys.log() / math.log(self.dims.train_seq_len)).clamp(min=1.0)

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, seq_len: int, prepared: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q scaled by s(n), k as it is."""
        scale = prepared if prepared is not None else self.prepare(positions, seq_len, {})
        if scale is None:
            return q, k
        scale = scale[:, None] if scale.dim() == 1 else scale[:, None, :, None]  # (T, 1) or (B, 1, T, 1)
        return q * scale.to(q.dtype), k

    @classmethod
    def parse_variation(cls, spec: str, cfg: ScaledNoPEConfig) -> dict[str, Any]:
        """``score_scaling:on`` or ``score_scaling:off``."""
        name, _, switch = spec.partition(":")
        if name != "score_scaling" or switch not in SWITCHES:
            raise PosGPTError(
                f"eval.variations: pe=scaled_nope takes score_scaling:on or score_scaling:off (got {spec!r})"
            )
        return {"score_scaling": SWITCHES[switch]}

    @classmethod
    def check_variations(cls, cfg: ScaledNoPEConfig, specs: Sequence[str]) -> None:
        for spec in specs:
            cls.parse_variation(spec, cfg)

    @classmethod
    def variation_label(cls, settings: dict[str, Any]) -> str:
        return "" if settings.get("score_scaling", True) else "no score scaling"

    def apply_eval_setting(self, name: str, value: Any) -> None:
        self.cfg.score_scaling = bool(value)

    def extra_repr(self) -> str:
        return f"name={self.name!r}, score_scaling={self.cfg.score_scaling}"


class SwanPositionalEncoding(HybridPositionalEncoding):
    """SWAN-GPT: three sliding-window RoPE layers, then a global NoPE layer with its scores scaled (module
    docstring)."""

    name = "swan"
    default_pattern = ("swa_rope", "swa_rope", "swa_rope", "scaled_nope")
