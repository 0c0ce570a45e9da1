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
- ``llama3`` (Meta's Llama 3.1; Hugging Face's "llama3"): by wavelength lambda_i = 2 pi / theta_i, pairs with
  lambda_i < L / high_freq_factor are kept, pairs with lambda_i > L / low_freq_factor are divided by s, and in
  between theta'_i = (1 - g_i) theta_i / s + g_i theta_i with g_i = (L / lambda_i - low_freq_factor) /
  (high_freq_factor - low_freq_factor), i.e. linear in the number of turns r_i = L / lambda_i over L. YaRN's
  NTK-by-parts with the ramp over turns (eq. 18) between beta_slow = low_freq_factor and beta_fast =
  high_freq_factor, and no temperature (a = 1). Defaults (null): Llama 3.1's 1 and 4.
- ``longrope`` (Ding et al. 2024, "LongRoPE: Extending LLM Context Window Beyond 2 Million Tokens"; Phi-3;
  Hugging Face's "longrope"): theta'_i = theta_i / lambda_i, one factor lambda_i per pair, searched for a given
  model and extension (the paper's evolutionary search; posgpt takes them as settings): ``short_factor`` while
  L' <= L, ``long_factor`` beyond, so the rotation depends on the current length (a KV cache keeps keys
  unrotated, as for ``dynamic_ntk``). Attention factor a = sqrt(1 + ln s / ln L) for s > 1 (1 for s = 1), or
  ``attention_factor`` when set. Both lists have d/2 numbers (d the rotated dimensions), else refused.

  Hugging Face's parameters in posgpt: ``original_max_position_embeddings`` is L (the training length, or
  ``original_seq_len``), ``factor`` is s (Hugging Face falls back to max_position_embeddings / L when it is
  absent; posgpt has no maximum length, so s is always given, default 1), the current length (``seq_len``) is
  the number of keys L', and ``short_factor``, ``long_factor``, ``attention_factor`` keep their names. The same
  L plays ``original_max_position_embeddings`` for ``llama3``, whose ``factor``, ``low_freq_factor`` and
  ``high_freq_factor`` keep their names.

L is the training length, or ``original_seq_len`` when set: a model trained at 64 and then fine-tuned at 256
with a factor-4 scaling (Chen et al. and Peng et al. fine-tune so; ``train.init_from``) keeps L = 64, the length
whose angles its weights learned, so its frequencies are those its parent gets from the same scaling.

With s = 1 every method but ``dynamic_ntk`` is the identity (``dynamic_ntk`` then uses s' = L' / L; ``longrope``
divides by its per-pair factors whatever s, so it is the identity when they are all 1). To add
a method, write a function with the signature of ``_none``, add it to ``ROPE_SCALINGS`` (and to
``LENGTH_DEPENDENT`` if it reads the current length), declare the settings only it reads with ``used_with``, and
test its equation in tests/model/pe/test_rope_scaling.py (llama3 and longrope:
tests/model/pe/test_rope_scaling_llama3_longrope.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from core.domain import check_domains, choice, domain, used_with
from core.errors import PosGPTError

# The settings only some types read (core.domain.used_with): (the selector field, its values that read them).
_YARN, _LLAMA3, _LONGROPE = ("type", ("yarn",)), ("type", ("llama3",)), ("type", ("longrope",))


LLAMA3_FREQ_FACTORS = (1.0, 4.0)  # Llama 3.1's low_freq_factor and high_freq_factor: the defaults


# (inv_freq, cfg, base, head_dim, train_len, seq_len) -> (inv_freq, attention_factor)
ScalingFn = Callable[[torch.Tensor, "RoPEScalingConfig", float, int, int, int], tuple[torch.Tensor, float]]


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


def llama3_freq_factors(low: float | None, high: float | None) -> tuple[float, float]:
    """(low_freq_factor, high_freq_factor), Llama 3.1's where null."""
    default_low, default_high = LLAMA3_FREQ_FACTORS
    return (default_low if low is None else low, default_high if high is None else high)


def _llama3(inv_freq, cfg, base, head_dim, train_len, seq_len):
    low, high = llama3_freq_factors(cfg.low_freq_factor, cfg.high_freq_factor)
    turns = train_len * inv_freq / (2 * math.pi)  # r_i = L / lambda_i
    # 0 below low turns (interpolated), 1 above high turns (kept), linear in r_i between
    kept = ((turns - low) / (high - low)).clamp(0.0, 1.0)
    return (1 - kept) * inv_freq / cfg.factor + kept * inv_freq, 1.0


def _longrope(inv_freq, cfg, base, head_dim, train_len, seq_len):
    factors = cfg.long_factor if seq_len > train_len else cfg.short_factor
    scaled = inv_freq / torch.tensor(list(factors), dtype=torch.float64, device=inv_freq.device)
    if cfg.attention_factor is not None:
        return scaled, cfg.attention_factor
    if cfg.factor <= 1.0:
        return scaled, 1.0
    return scaled, math.sqrt(1 + math.log(cfg.factor) / math.log(train_len))


ROPE_SCALINGS: dict[str, ScalingFn] = {
    "none": _none,
    "linear": _linear,
    "ntk": _ntk,
    "dynamic_ntk": _dynamic_ntk,
    "yarn": _yarn,
    "llama3": _llama3,
    "longrope": _longrope,
}
# The types whose frequencies depend on the current length L' (a KV cache then keeps keys unrotated).
LENGTH_DEPENDENT = ("dynamic_ntk", "longrope")


@dataclass
class RoPEScalingConfig:
    type: str = choice("none", tuple(ROPE_SCALINGS))  # the method (the module docstring)
    factor: float = domain(1.0, ge=1)  # s: how many times longer than the training length to reach
    # yarn only: pairs turning more than beta_fast times over L are kept, fewer than beta_slow interpolated
    beta_fast: float = domain(32.0, gt=0, used_with=_YARN)
    beta_slow: float = domain(1.0, gt=0, used_with=_YARN)
    # yarn and longrope: a; null: the paper's (yarn: 0.1 ln(s) + 1)
    attention_factor: float | None = domain(None, gt=0, used_with=("type", ("yarn", "longrope")))
    # L: the length the frequencies were learned at; null: train.seq_len. A run extended by fine-tuning
    # (train.init_from, training/init_from.py) keeps its parent's L: yarn, dynamic_ntk, llama3, longrope depend on it.
    original_seq_len: int | None = domain(None, ge=1)
    # llama3 only: pairs turning fewer times over L are divided by s (null: 1); more times are kept (null: 4)
    low_freq_factor: float | None = domain(None, gt=0, used_with=_LLAMA3)
    high_freq_factor: float | None = domain(None, gt=0, used_with=_LLAMA3)
    # longrope only: d/2 divisors of the frequencies while L' <= L (short) and beyond (long)
    short_factor: list[float] | None = domain(None, gt=0, used_with=_LONGROPE)
    long_factor: list[float] | None = domain(None, gt=0, used_with=_LONGROPE)


# The settings only some types use, without a default of their own (declared with each field: used_with): any other
# type but none (which holds them as the defaults of eval.variations' entries, see parse_scaling) refuses them, and
# core.domain.check_used refuses any type-specific setting (YaRN's betas too) that no type of the run reads.
TYPE_SETTINGS = {
    field.name: used_with(field)[1]
    for field in dataclasses.fields(RoPEScalingConfig)
    if used_with(field) is not None and field.default is None
}


def check_scaling(cfg: RoPEScalingConfig, where: str = "pe.scaling") -> None:
    """PosGPTError unless cfg names a known method with a usable factor."""
    check_domains(cfg, f"{where}: ")
    if cfg.type == "none" and cfg.factor != 1.0:
        raise PosGPTError(f"{where}: type none takes no factor (got {cfg.factor}); pick a type, e.g. yarn")
    # Type none may hold the other types' settings: they are the defaults of eval.variations' entries (parse_scaling).
    if cfg.attention_factor is not None and cfg.type not in (*TYPE_SETTINGS["attention_factor"], "none"):
        raise PosGPTError(
            f"{where}: attention_factor is YaRN's temperature (or LongRoPE's factor), for type yarn or longrope "
            f"(got {cfg.attention_factor} with type {cfg.type})"
        )
    if cfg.type == "yarn" and not cfg.beta_slow < cfg.beta_fast:
        raise PosGPTError(f"{where}: yarn needs beta_slow < beta_fast (got {cfg.beta_slow}, {cfg.beta_fast})")
    for name, types in TYPE_SETTINGS.items():
        if getattr(cfg, name) is not None and cfg.type not in (*types, "none"):
            raise PosGPTError(f"{where}: {name} is a setting of type {' and '.join(types)}, not {cfg.type}; drop it")
    low, high = llama3_freq_factors(cfg.low_freq_factor, cfg.high_freq_factor)
    if not 0 < low < high:
        raise PosGPTError(f"{where}: llama3 needs 0 < low_freq_factor < high_freq_factor (got {low}, {high})")


def check_scaling_fits(cfg: RoPEScalingConfig, rotated_dims: int, where: str = "pe.scaling") -> None:
    """PosGPTError unless longrope's factor lists have one number per rotated pair (d/2)."""
    if cfg.type != "longrope":
        return
    pairs = rotated_dims // 2
    for name in ("short_factor", "long_factor"):
        factors = getattr(cfg, name)
        if factors is None or len(factors) != pairs:
            got = "none" if factors is None else f"{len(factors)}"
            raise PosGPTError(
                f"{where}: longrope needs {name}, a list of {pairs} numbers (one per rotated pair: {rotated_dims} "
                f"dimensions / 2); got {got}"
            )


def parse_scaling(spec: str, defaults: RoPEScalingConfig | None = None) -> RoPEScalingConfig:
    """``"yarn:8"`` -> RoPEScalingConfig(type="yarn", factor=8); ``"none"`` -> no scaling.

    The type-specific settings (yarn's betas and attention_factor, llama3's frequency factors, longrope's
    lists and attention_factor) come from ``defaults`` (the run's ``pe.scaling``), so they are set once for every
    spec; a type gets only those of ``TYPE_SETTINGS`` it uses.
    """
    defaults = defaults or RoPEScalingConfig()
    kind, _, factor = str(spec).partition(":")
    try:
        value = float(factor) if factor else 1.0
    except ValueError:
        raise PosGPTError(f"eval.variations: {spec!r} is not TYPE or TYPE:FACTOR (e.g. yarn:8)") from None
    kind = kind.strip()
    unused = {name: None for name, types in TYPE_SETTINGS.items() if kind not in types}
    cfg = dataclasses.replace(defaults, type=kind, factor=value, **unused)
    check_scaling(cfg, where=f"eval.variations entry {spec!r}")
    return cfg


def scaling_label(scaling: dict | RoPEScalingConfig | None) -> str:
    """A short name for a scaling: ``none``, ``yarn:8``; YaRN's betas and attention factor are shown only when not
    the paper's (32, 1, 0.1 ln(s) + 1), llama3's frequency factors and longrope's attention factor only when set
    (longrope's factor lists never: they are the run's)."""
    if scaling is None:
        return ""
    if isinstance(scaling, RoPEScalingConfig):
        scaling = dataclasses.asdict(scaling)
    if scaling["type"] == "none":
        return "none"
    label = f"{scaling['type']}:{scaling['factor']:g}"
    if scaling["type"] == "yarn" and (scaling.get("beta_fast", 32.0), scaling.get("beta_slow", 1.0)) != (32.0, 1.0):
        label += f"(beta_fast={scaling['beta_fast']:g},beta_slow={scaling['beta_slow']:g})"
    freq_factors = (scaling.get("low_freq_factor"), scaling.get("high_freq_factor"))
    if scaling["type"] == "llama3" and freq_factors != (None, None):
        low, high = llama3_freq_factors(*freq_factors)
        label += f"(low_freq_factor={low:g},high_freq_factor={high:g})"
    if scaling["type"] in ("yarn", "longrope") and scaling.get("attention_factor") is not None:
        label += f"(attention_factor={scaling['attention_factor']:g})"
    return label
