"""Sliding-window RoPE: RoPE (Su et al. 2021) in a layer whose queries attend only their W most recent keys,

    attention_i = softmax_j( q'_i . k'_j / sqrt(d) )  over  i - W < j <= i,
    q'_m = R(m theta) q_m,   k'_n = R(n theta) k_n

the local layers of SWAN-GPT (Puvvada et al. 2025, "SWAN-GPT: An Efficient and Scalable Approach for Long-Context
Language Modeling", arXiv:2504.08719; window 512 at training length 4096) and of Cohere's RNoPE-SWA, Gemma and
Mistral. Rotations as ``pe=rope`` (rope.py; ``pe.base``, ``pe.rotary_fraction``); ``pe.window`` is W in tokens. The
window is by index, as the causal mask (model/pe/capabilities.py, ``SlidingWindow``), and every attention path applies
it (model/kernels.py). A query never sees a distance of W or more, so RoPE's context extensions (scalings, remaps)
have nothing to extend: they are refused, at training and as evaluation-time variations. Alone it is a local model
whose reach grows with depth (n_layer x (W - 1) tokens); in a pattern (hybrid.py, ``pe=swan``) it is the local part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.domain import domain
from core.errors import PosGPTError
from model.pe.base import ModelDims
from model.pe.capabilities import SlidingWindow
from model.pe.rope import RoPEConfig, RotaryPositionalEncoding


@dataclass
class SlidingWindowRoPEConfig(RoPEConfig):
    name: str = "swa_rope"
    # W, the keys each query attends, itself included; 8 = L/8 at posgpt's default train.seq_len=64, the paper's ratio
    # (512 at 4096)
    window: int = domain(8, ge=1)


class SlidingWindowRoPE(SlidingWindow, RotaryPositionalEncoding):
    name = "swa_rope"
    config_class = SlidingWindowRoPEConfig
    eval_time_settings = ()  # no distance reaches past the window: nothing to extend

    def __init__(self, cfg: SlidingWindowRoPEConfig, dims: ModelDims) -> None:
        check_no_extension(cfg)
        super().__init__(cfg, dims)

    @classmethod
    def check_model(cls, cfg: SlidingWindowRoPEConfig, dims: ModelDims) -> None:
        check_no_extension(cfg)
        super().check_model(cfg, dims)

    def sliding_window(self) -> int | None:
        return self.cfg.window

    @classmethod
    def parse_variation(cls, spec: str, cfg: SlidingWindowRoPEConfig) -> dict[str, Any]:
        raise PosGPTError(
            f"eval.variations: pe=swa_rope attends {cfg.window} keys at most, so RoPE's context extensions have no "
            f"distance to extend (got {spec!r})"
        )

    @classmethod
    def variation_label(cls, settings: dict[str, Any]) -> str:
        return ""

    def settings(self) -> dict[str, Any]:
        return {}

    def extra_repr(self) -> str:
        return f"name={self.name!r}, window={self.cfg.window}"


def check_no_extension(cfg: SlidingWindowRoPEConfig) -> None:
    """PosGPTError when a context extension of RoPE is set: within a window no distance needs one."""
    if cfg.scaling.type != "none" or cfg.remap.type != "none":
        raise PosGPTError(
            f"pe=swa_rope attends {cfg.window} keys at most, so RoPE's context extension (pe.scaling.type="
            f"{cfg.scaling.type}, pe.remap.type={cfg.remap.type}) has no distance to extend: leave both none"
        )
