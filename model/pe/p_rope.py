"""p-RoPE: RoPE with its lowest frequencies removed (Barbero et al. 2025, "Round and Round We Go! What makes
Rotary Positional Encodings useful?", ICLR 2025, sec. 6).

RoPE turns pair i by m theta_i, theta_i = base^(-2i/d), i = 0 .. d/2 - 1 (rope.py). p-RoPE keeps the fraction p
of the frequencies, the highest ones, and sets the others to zero:

    theta^p_i = base^(-2i/d)  for i < k,      theta^p_i = 0  for k <= i < d/2,      k = p d / 2

so the last d/2 - k pairs (the largest wavelengths) are never rotated: their angle is 0 at every position, and
q'_m . k'_n on them is q_m . k_n whatever the positions. The paper's reasoning: trained models use the lowest
frequencies as semantic channels, which RoPE still turns slowly, so beyond the lengths seen in training they
drift; without a rotation they are robust. p = 1 is RoPE, p = 0 no positional encoding (NoPE); in the paper's
Gemma 2B experiments p = 0.75 lowers RoPE's validation perplexity (posgpt's default). k must be a whole number:
a p with p d / 2 fractional is refused at start-up, where the paper's listing (``int(p * d // 2)``), Gemma's
``rope_proportion`` and Hugging Face's "proportional" RoPE type round it down (they agree on every whole k:
tests/model/pe/test_p_rope.py compares the frequencies with Hugging Face's).

Not ``pe=rope pe.rotary_fraction=p`` (GPT-NeoX's partial rotary): that rotates the first p d coordinates with
the complete spectrum of a p d-dimensional RoPE, theta_i = base^(-2i/(p d)), i < p d / 2, down to the lowest
frequency base^(-(pd-2)/(pd)); p-RoPE keeps the frequencies of the d-dimensional RoPE and drops its lowest
ones. Both leave (1 - p) d coordinates unrotated; they differ in which frequencies the rotated ones get.

The kept pairs are those of RoPE: (i, i + d/2), as in rope.py, and the truncated ones are rotated by angle 0
(cos 1, sin 0), so p-RoPE runs RoPE's own code at RoPE's cost. A scaling (``pe.scaling``, rope_scaling.py, at
evaluation time or with train.init_from) rewrites RoPE's d/2 frequencies as it would for pe=rope, with the same
d, base and L; the truncated pairs then stay at zero. So a kept pair gets the frequency it has under pe=rope with
that scaling, and the scalings' settings (longrope's d/2 factors) are those of the d-dimensional RoPE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from core.domain import domain
from core.errors import PosGPTError
from model.pe.base import ModelDims
from model.pe.rope import RoPEConfig, RotaryPositionalEncoding


@dataclass
class PRoPEConfig(RoPEConfig):
    name: str = "p_rope"
    p: float = domain(0.75, ge=0, le=1)  # fraction of the frequencies kept, the highest; 1: RoPE, 0: NoPE


def kept_pairs(head_dim: int, p: float) -> int:
    """k = p d / 2: how many pairs, the fastest, keep their frequency. A fraction of a pair is refused (one line
    naming the nearest whole choices), as rope's rotary_fraction is: the paper's listing rounds it down (``int(p *
    d // 2)``), which would make pe.p=0.3 the same run as 0.25 without saying so."""
    pairs = head_dim // 2
    kept = round(p * pairs)
    if not math.isclose(kept, p * pairs, abs_tol=1e-9):
        below, above = math.floor(p * pairs), math.ceil(p * pairs)
        raise PosGPTError(
            f"pe.p={p} keeps {p * pairs:g} of the {pairs} frequency pairs of a head of {head_dim} dimensions "
            f"(model.n_embd/model.n_head): not a whole number; choose pe.p={below / pairs:g} ({below} pairs) or "
            f"{above / pairs:g} ({above})"
        )
    return kept


def _check_all_rotated(cfg: PRoPEConfig) -> None:
    if cfg.rotary_fraction != 1.0:
        raise PosGPTError(
            f"pe=p_rope truncates frequencies, not dimensions: set pe.p, not pe.rotary_fraction "
            f"(got {cfg.rotary_fraction}); GPT-NeoX's partial rotary is pe=rope pe.rotary_fraction"
        )


class PartialRotaryPositionalEncoding(RotaryPositionalEncoding):
    name = "p_rope"
    config_class = PRoPEConfig

    def __init__(self, cfg: PRoPEConfig, dims: ModelDims) -> None:
        _check_all_rotated(cfg)
        super().__init__(cfg, dims)
        self.kept = kept_pairs(self.rotated, cfg.p)

    @classmethod
    def check_model(cls, cfg: PRoPEConfig, dims: ModelDims) -> None:
        _check_all_rotated(cfg)
        super().check_model(cfg, dims)
        kept_pairs(dims.head_dim, cfg.p)

    def frequencies(self, seq_len: int) -> tuple[torch.Tensor, float]:
        inv_freq, attention_factor = super().frequencies(seq_len)
        truncated = torch.arange(inv_freq.numel(), device=inv_freq.device) >= self.kept
        return inv_freq.masked_fill(truncated, 0.0), attention_factor

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, p={self.cfg.p}, kept_pairs={self.kept} of {self.rotated // 2}"
