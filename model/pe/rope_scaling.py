"""RoPE context extension without fine-tuning: functions that rewrite RoPE's frequencies.

RoPE turns coordinate pair i at position m by the angle m theta_i, theta_i = base^(-2i/d), i = 0 .. d/2 - 1.
Over the training length L pair i makes r_i = L theta_i / (2 pi) turns (its wavelength is 2 pi / theta_i).
The fast pairs (r_i >> 1) have shown the model every angle; the slow ones (r_i < 1) only part of a turn, so
beyond L they produce angles never seen in training. Each method maps the frequencies theta_i, the factor s
(how many times L to reach), L and the current length L' to new frequencies theta'_i and an attention factor
a that multiplies cos and sin, so that every attention logit q.k is multiplied by a^2:

- ``none``: theta'_i = theta_i.
- ``linear`` (position interpolation; Chen et al. 2023, "Extending Context Window of Large Language Models
  via Positional Interpolation"): theta'_i = theta_i / s, i.e. position m is encoded as m / s, so positions
  up to s L fall inside the trained range.
- ``ntk`` ("NTK-aware" scaling; bloc97 2023): base' = base s^(d / (d - 2)). The fastest pair is untouched
  (theta'_0 = theta_0) and the slowest, theta_{d/2-1} = base^(-(d-2)/d), is divided by exactly s.
- ``dynamic_ntk`` (emozilla 2023; Hugging Face's "dynamic"): ``ntk`` with the factor chosen from the current
  length, s' = s L' / L - (s - 1) for L' > L, and no change while L' <= L.
- ``yarn`` (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language Models", sec. 3.2
  "NTK-by-parts" and 3.4): theta'_i = (1 - gamma_i) theta_i / s + gamma_i theta_i, where gamma_i = 1 keeps
  the pairs that turn more than beta_fast = 32 times over L (they encode local order, which PI would blur),
  gamma_i = 0 interpolates the pairs that turn less than beta_slow = 1 time, and gamma ramps linearly in
  between. Attention temperature: a = sqrt(1/t) = 0.1 ln(s) + 1, or ``attention_factor`` when set (as in
  Hugging Face's ``rope_scaling``; 1 turns the temperature off, to tell its effect from the frequencies').

  The ramp: the paper's eq. 18 writes gamma linear in r. Its reference implementation (which produced the
  paper's results) and Hugging Face's ``modeling_rope_utils`` ramp linearly over the pair index instead,
  from i_fast = max(floor(i(beta_fast)), 0) (kept) to i_slow = min(ceil(i(beta_slow)), d - 1) (interpolated),
  where i(r) = d ln(L / (2 pi r)) / (2 ln base) is the fractional pair that turns r times over L. Both keep
  the pairs up to i_fast and interpolate those from i_slow on; in between they differ, and on small models,
  where even pair 0 turns fewer than beta_fast times (head_dim 16, L = 64: r_0 = 10), the clamp keeps pair 0
  where eq. 18 would partly interpolate it. posgpt follows the reference implementation: "yarn" here is
  YaRN as models ship with it.

L is the training length, or ``original_seq_len`` when set: a model trained at 64 and then fine-tuned at 256
with a factor-4 scaling (Chen et al. and Peng et al. fine-tune so; ``train.init_from``) keeps L = 64, the length
whose angles its weights learned, so its frequencies are those its parent gets from the same scaling.

With s = 1 every method but ``dynamic_ntk`` is the identity (``dynamic_ntk`` then uses s' = L' / L). To add
a method, write a function with the signature of ``_none``, add it to ``ROPE_SCALINGS``, and test its
equation in tests/test_rope_scaling.py.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from core.errors import PosGPTError


@dataclass
class RoPEScalingConfig:
    type: str = "none"  # none | linear | ntk | dynamic_ntk | yarn
    factor: float = 1.0  # s: how many times longer than the training length to reach
    beta_fast: float = 32.0  # yarn only: pairs turning more than this many times over L are kept
    beta_slow: float = 1.0  # yarn only: pairs turning fewer times are interpolated
    attention_factor: float | None = None  # yarn only: a; null: the paper's 0.1 ln(s) + 1
    # L: the length the frequencies were learned at; null: train.seq_len. A run extended by fine-tuning
    # (train.init_from, training/init_from.py) keeps its parent's L: yarn and dynamic_ntk depend on it.
    original_seq_len: int | None = None


# (inv_freq, cfg, base, head_dim, train_len, seq_len) -> (inv_freq, attention_factor)
ScalingFn = Callable[[torch.Tensor, RoPEScalingConfig, float, int, int, int], tuple[torch.Tensor, float]]


def rope_inv_freq(head_dim: int, base: float) -> torch.Tensor:
    """theta_i = base^(-2i/d), i = 0 .. d/2 - 1, in float64."""
    return base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def ntk_base(base: float, factor: float, head_dim: int) -> float:
    """base' = base s^(d / (d - 2)): the base whose slowest frequency is the original one divided by s."""
    return base * factor ** (head_dim / (head_dim - 2))


def yarn_pair_index(rotations: float, head_dim: int, base: float, train_len: int) -> float:
    """i(r) = d ln(L / (2 pi r)) / (2 ln base): the (fractional) pair index that turns r times over L."""
    return head_dim * math.log(train_len / (2 * math.pi * rotations)) / (2 * math.log(base))


def _none(inv_freq, cfg, base, head_dim, train_len, seq_len):
    return inv_freq, 1.0


def _linear(inv_freq, cfg, base, head_dim, train_len, seq_len):
    return inv_freq / cfg.factor, 1.0


def _ntk(inv_freq, cfg, base, head_dim, train_len, seq_len):
    return rope_inv_freq(head_dim, ntk_base(base, cfg.factor, head_dim)).to(inv_freq.device), 1.0


def _dynamic_ntk(inv_freq, cfg, base, head_dim, train_len, seq_len):
    if seq_len <= train_len:
        return inv_freq, 1.0
    factor = cfg.factor * seq_len / train_len - (cfg.factor - 1)
    return rope_inv_freq(head_dim, ntk_base(base, factor, head_dim)).to(inv_freq.device), 1.0


def _yarn(inv_freq, cfg, base, head_dim, train_len, seq_len):
    fast = max(math.floor(yarn_pair_index(cfg.beta_fast, head_dim, base, train_len)), 0)
    slow = min(math.ceil(yarn_pair_index(cfg.beta_slow, head_dim, base, train_len)), head_dim - 1)
    pair = torch.arange(inv_freq.numel(), dtype=torch.float64, device=inv_freq.device)
    # 0 up to the fast pair (kept), 1 from the slow pair on (interpolated); the 1e-3 avoids 0/0 when they meet.
    interpolated = ((pair - fast) / max(slow - fast, 1e-3)).clamp(0.0, 1.0)
    scaled = interpolated * inv_freq / cfg.factor + (1 - interpolated) * inv_freq
    if cfg.attention_factor is not None:
        return scaled, cfg.attention_factor
    return scaled, 0.1 * math.log(cfg.factor) + 1.0


ROPE_SCALINGS: dict[str, ScalingFn] = {
    "none": _none,
    "linear": _linear,
    "ntk": _ntk,
    "dynamic_ntk": _dynamic_ntk,
    "yarn": _yarn,
}


def check_scaling(cfg: RoPEScalingConfig, where: str = "pe.scaling") -> None:
    """PosGPTError unless cfg names a known method with a usable factor."""
    if cfg.type not in ROPE_SCALINGS:
        raise PosGPTError(f"unknown {where} type {cfg.type!r}; choose one of {sorted(ROPE_SCALINGS)}")
    if cfg.factor < 1.0:
        raise PosGPTError(f"{where}: the scaling factor must be >= 1 (got {cfg.factor})")
    if cfg.type == "none" and cfg.factor != 1.0:
        raise PosGPTError(f"{where}: type none takes no factor (got {cfg.factor}); pick a type, e.g. yarn")
    if cfg.original_seq_len is not None and cfg.original_seq_len <= 0:
        raise PosGPTError(f"{where}: original_seq_len must be positive or null (got {cfg.original_seq_len})")
    # Type none may hold YaRN's settings: they are the defaults of eval.variations' yarn entries (parse_scaling).
    if cfg.attention_factor is not None and (cfg.type not in ("yarn", "none") or cfg.attention_factor <= 0):
        raise PosGPTError(
            f"{where}: attention_factor is YaRN's temperature, a positive number for type yarn "
            f"(got {cfg.attention_factor} with type {cfg.type})"
        )
    if cfg.type == "yarn" and not 0 < cfg.beta_slow < cfg.beta_fast:
        raise PosGPTError(f"{where}: yarn needs 0 < beta_slow < beta_fast (got {cfg.beta_slow}, {cfg.beta_fast})")


def parse_scaling(spec: str, defaults: RoPEScalingConfig | None = None) -> RoPEScalingConfig:
    """``"yarn:8"`` -> RoPEScalingConfig(type="yarn", factor=8); ``"none"`` -> no scaling.

    The yarn settings (betas, attention_factor) come from ``defaults`` (the run's ``pe.scaling``), so they are
    set once for every spec; the other types take no attention_factor.
    """
    defaults = defaults or RoPEScalingConfig()
    kind, _, factor = str(spec).partition(":")
    try:
        value = float(factor) if factor else 1.0
    except ValueError:
        raise PosGPTError(f"eval.variations: {spec!r} is not TYPE or TYPE:FACTOR (e.g. yarn:8)") from None
    kind = kind.strip()
    cfg = dataclasses.replace(
        defaults, type=kind, factor=value, attention_factor=defaults.attention_factor if kind == "yarn" else None
    )
    check_scaling(cfg, where=f"eval.variations entry {spec!r}")
    return cfg


def scaling_label(scaling: dict | RoPEScalingConfig | None) -> str:
    """A short name for a scaling: ``none``, ``yarn:8``; YaRN's betas and attention factor are shown only when not
    the paper's (32, 1, 0.1 ln(s) + 1)."""
    if scaling is None:
        return ""
    if isinstance(scaling, RoPEScalingConfig):
        scaling = dataclasses.asdict(scaling)
    if scaling["type"] == "none":
        return "none"
    label = f"{scaling['type']}:{scaling['factor']:g}"
    if scaling["type"] == "yarn" and (scaling.get("beta_fast", 32.0), scaling.get("beta_slow", 1.0)) != (32.0, 1.0):
        label += f"(beta_fast={scaling['beta_fast']:g},beta_slow={scaling['beta_slow']:g})"
    if scaling["type"] == "yarn" and scaling.get("attention_factor") is not None:
        label += f"(attention_factor={scaling['attention_factor']:g})"
    return label
