"""Length-dependent attention temperature (``model.attn_temperature``), for every positional scheme.

Each query's content logits are multiplied by a factor tau(n) of n, the number of keys the query attends:

    attention_i = softmax_j( tau(n_i) q_i . k_j / sqrt(d) + bias_ij )

It is applied as a scale of the query, q_i <- tau(n_i) q_i, after the scheme's rotation and before attention:
a per-row scale of q . k, so every attention path (sdpa's fused causal kernel, FlexAttention, the written-out
one) runs unchanged and as fast. A scheme's score bias and the sink logit (``model.attn_sink``)
are added unscaled, as Llama 4 scales its query states; so is anything a scheme computes from the scaled query
(gates computed from the scores see tau q).

Types (``model.attn_temperature.type``), L = train.seq_len, the length the weights were trained at:

- ``none``: tau = 1 (the model as before this option: the same logits, bit for bit).
- ``logn``: log-n scaling, training-free (Chiang & Cholak 2022, "Overcoming a theoretical limitation of
  self-attention", sec. 5, multiply by log n; Su 2021, "entropy invariance", log_L n; Qwen's use_logn_attn
  clamps it to 1 within the training length, which is taken here so the run is unchanged up to L):

      tau(n) = max(1, log n / log L)

- ``llama4``: Llama 4's attention temperature tuning (Hugging Face transformers, modeling_llama4.py,
  ``attn_temperature_tuning``; Llama 4 applies it to its NoPE layers, here to every layer):

      tau(n) = 1 + attn_scale * log( floor(n / floor_scale) + 1 ),   n = cache_position + 1

  Llama 4 sets floor_scale = 8192 and attn_scale = 0.1; ``floor_scale: null`` (the default here) takes L,
  so tau = 1 up to the training length and steps up by attn_scale log 2 at 2L.
- ``drope``: the inference-time softmax temperature of DroPE (Gelberg et al. 2025, "Extending the Context of
  Pretrained LLMs by Dropping Their Positional Embeddings"), training-free, reported as beta = 1 + c ln s with s
  the extension factor, the evaluated length over the training length. Here s is per sequence: the keys of the
  forward's window (q_offset + Tq, its whole length in a full forward) over L, one factor for every query of it,
  held at 1 within L (our choice, which leaves the model at its own length bit for bit as trained):

      tau = 1 + c ln max(1, (q_offset + Tq) / L)

  What was checked: the reference (SakanaAI/DroPE) has no length-dependent temperature in its code; its one hook
  is a constant ``softmax_scale`` in the model config that replaces the attention's ``scaling`` (1/sqrt(d)) of
  q . k (custom_models/attention.py, NoPEAttention.from_source and the forwards' ``scaling=self.scaling``), so a
  temperature there multiplies the content logits, one constant for the loaded model, i.e. for the sequence length
  it is evaluated at; the scale of q here is the same per-row scale of those logits. The form 1 + c ln s is the
  paper's as reported; the paper's text on it (and its value of c) could not be read from the stored copies
  available here (only its opening), so c's default, 0.1, is YaRN's coefficient of the same form (its
  sqrt(1/t) = 0.1 ln s + 1), not a value taken from the DroPE paper: set ``c`` to the paper's. With a KV cache each
  decoding step takes the s of the keys so far, so decoding step by step differs from a full forward of the same
  tokens, where every query takes the window's s (as the reference's model loaded with one scale would give).
- ``ssmax``: Scalable-Softmax (Nakanishi 2025, "Scalable-Softmax Is Superior for Attention", eq. 2),
  z -> softmax((s log n) z), with s learned per layer and head:

      tau(n) = s_h log n

  trained with (the paper's setting: its best results train with SSMax from the start). s starts at 1/log L,
  so that tau(L) = 1: the plain softmax at the training length (our choice; initialisation of s is the
  model's, GPT._init_weights leaves it).

Which n. n counts the keys a query attends, not its position label: with a KV cache the cached keys count
(n = q_offset + i + 1 for the i-th new query), with randomized positions (train.random_positions) the i-th token
of a row attends i + 1 keys whatever positions it was given (the factor answers the softmax's size, which is the
number of keys), and in the ``streaming`` evaluation n is the number of keys in the cache (sinks and window),
at most the evaluated length; with documents packed into a row (``data.document_aware``) the keys of its own
document. The sink logit is not a key. For Llama 4 this is its cache_position + 1 whenever
the cache holds every earlier token, as in transformers.

At evaluation (eval.py, sample.py) a run trained without a temperature may be evaluated with ``logn``, ``llama4``
or ``drope`` (parameter-free); ``ssmax`` has learned parameters, so it is a training option only, and a run trained
with it is evaluated with it (:func:`check_evaluation_change`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from core.domain import choice, domain
from core.errors import PosGPTError

TEMPERATURES = ("none", "logn", "llama4", "ssmax", "drope")
LEARNED = ("ssmax",)  # types with parameters: fixed at training


@dataclass
class TemperatureConfig:
    type: str = choice("none", TEMPERATURES)
    # llama4 only (core.domain.used_with): the step length, None: train.seq_len (Llama 4: 8192); the factor's growth
    # per step (Llama 4: 0.1)
    floor_scale: int | None = domain(None, ge=1, used_with=("type", ("llama4",)))
    attn_scale: float = domain(0.1, ge=0, used_with=("type", ("llama4",)))
    # drope only: beta = 1 + c ln s (the module docstring says where 0.1 comes from)
    c: float = domain(0.1, ge=0, used_with=("type", ("drope",)))


def check_temperature(cfg: TemperatureConfig, train_seq_len: int) -> None:
    """PosGPTError unless the temperature's settings can run with this training length."""
    if cfg.type in ("logn", "ssmax") and train_seq_len < 2:
        raise PosGPTError(
            f"model.attn_temperature.type={cfg.type} divides by log(train.seq_len), which is 0 at "
            f"train.seq_len={train_seq_len}; train at 2 tokens or more"
        )


def check_evaluation_change(trained: TemperatureConfig, now: TemperatureConfig) -> None:
    """PosGPTError when an evaluation's temperature would add or drop learned parameters (ssmax)."""
    if trained.type != now.type and (trained.type in LEARNED or now.type in LEARNED):
        raise PosGPTError(
            f"model.attn_temperature.type={now.type}: the run was trained with {trained.type}, and "
            f"{', '.join(LEARNED)} learns its parameters in training, so an evaluation can neither add nor drop "
            "it; evaluate with the trained type, or add logn, llama4 or drope to a run trained with none"
        )


def temperature_settings(cfg: Any) -> dict[str, Any] | None:
    """What a result row records of the temperature (a config object or its dict): None for none."""
    settings = {name: cfg[name] if isinstance(cfg, dict) else getattr(cfg, name) for name in ("type", "floor_scale")}
    if settings["type"] == "none":
        return None
    if settings["type"] == "drope":
        return {"type": "drope", "c": cfg["c"] if isinstance(cfg, dict) else cfg.c}
    if settings["type"] != "llama4":
        return {"type": settings["type"]}
    attn_scale = cfg["attn_scale"] if isinstance(cfg, dict) else cfg.attn_scale
    return {**settings, "attn_scale": attn_scale}


def temperature_label(settings: dict[str, Any] | None) -> str:
    """``logn``, ``llama4(floor=64,a=0.1)``, ``drope(c=0.1)``: the temperature in tables and plot legends; "" for
    none."""
    if not settings:
        return ""
    if settings["type"] == "drope":
        return f"drope(c={settings['c']:g})"
    if settings["type"] != "llama4":
        return settings["type"]
    floor = settings["floor_scale"] or "L"
    return f"llama4(floor={floor},a={settings['attn_scale']:g})"


class AttentionTemperature(nn.Module):
    """One layer's temperature: scales its queries (see the module docstring)."""

    def __init__(self, cfg: TemperatureConfig, n_head: int, train_seq_len: int) -> None:
        super().__init__()
        check_temperature(cfg, train_seq_len)
        self.cfg = cfg
        self.train_seq_len = train_seq_len
        if cfg.type == "ssmax":
            self.s = nn.Parameter(torch.full((n_head,), 1.0 / math.log(train_seq_len)))

    def factors(
        self, q_offset: int, n_queries: int, device: torch.device, attended: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """tau for queries q_offset .. q_offset + n_queries - 1 among the keys: (Tq,), (H, Tq) for ssmax, or
        None when it is 1 throughout (type none, and drope within L). ``attended``: (B, Tq) the keys each query
        attends where that is not its index + 1 (documents packed into a row: its own document's); tau is then
        (B, 1, Tq) or (B, H, Tq). drope reads neither: its one factor is the window's."""
        kind = self.cfg.type
        if kind == "none":
            return None
        if kind == "drope":  # one factor for the window: s = its keys over L, whatever documents it packs
            extension = (q_offset + n_queries) / self.train_seq_len
            if extension <= 1:
                return None
            return torch.full((n_queries,), 1.0 + self.cfg.c * math.log(extension), device=device)
        if attended is None:
            n = torch.arange(q_offset + 1, q_offset + n_queries + 1, device=device, dtype=torch.float32)
        else:
            n = attended[:, None, :].to(device=device, dtype=torch.float32)
        if kind == "logn":
            return (n.log() / math.log(self.train_seq_len)).clamp(min=1.0)
        if kind == "llama4":
            floor_scale = self.cfg.floor_scale or self.train_seq_len
            return 1.0 + self.cfg.attn_scale * torch.log(torch.floor(n / floor_scale) + 1.0)
        return self.s[:, None] * n.log()  # ssmax

    def forward(self, q: torch.Tensor, q_offset: int, attended: torch.Tensor | None = None) -> torch.Tensor:
        """q (B, H, Tq, D), the last Tq queries of q_offset + Tq keys -> tau q (``attended``: see :meth:`factors`)."""
        tau = self.factors(q_offset, q.shape[-2], q.device, attended)
        return q if tau is None else q * tau[..., None].to(q.dtype)
