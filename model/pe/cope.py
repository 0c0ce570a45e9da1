"""CoPE: contextual position encoding (Golovneva, Wang, Weston & Sukhbaatar 2024, "Contextual Position
Encoding: Learning to Count What's Important", eqs. 3-5).

Positions are counted by the content: query i opens a gate on every earlier key,

    g_ij = sigmoid(q_i . k_j / sqrt(d)),     p_ij = sum_{t=j..i} g_it    (clamped to npos - 1)

so p_ij is a fractional count of the "relevant" tokens between j and i. Each integer position p has a
learned vector e[p] (per layer, shared by the heads, initialised to zero); the fractional one interpolates
its logits,

    z_i[p] = q_i . e[p],    z_i[p_ij] = (ceil(p) - p) z_i[floor(p)] + (p - floor(p)) z_i[ceil(p)]

and z_i[p_ij] is added to the attention logit of (i, j). As in the paper's reference code
(facebookresearch/RAM, projects/cope) the gate takes the already scaled and causally masked logit
(masked keys get gate 0) and q is the unscaled query.

The bias needs the scores themselves, so CoPE always runs the written-out attention path (``math``) on
every device: slower than the others, and O(T^2) memory per head. Token positions are not used at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from core.domain import domain
from model.pe.base import ModelDims, PEConfig, PositionalEncoding
from model.pe.capabilities import AttentionMods, CacheSlot, ModifiesAttention


@dataclass
class CoPEConfig(PEConfig):
    name: str = "cope"
    npos: int = domain(64, ge=2)  # integer positions with a vector; counts beyond npos - 1 are clamped


class CoPEPositionalEncoding(ModifiesAttention, PositionalEncoding):
    name = "cope"
    config_class = CoPEConfig
    modifies = frozenset({"score_mod"})

    def __init__(self, cfg: CoPEConfig, dims: ModelDims) -> None:
        super().__init__(cfg, dims)
        self.pos_emb = nn.Parameter(torch.zeros(dims.n_layer, dims.head_dim, cfg.npos))

    def no_weight_decay(self) -> list[nn.Parameter]:
        return [self.pos_emb]

    def attention_mods(
        self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, layer: int, cache: CacheSlot | None
    ) -> AttentionMods:
        """The content bias added to the written-out scores of each block of queries."""
        return AttentionMods(score_mod=lambda q, scores: scores + self.content_bias(q, scores, layer))

    def content_bias(self, q: torch.Tensor, scores: torch.Tensor, layer: int) -> torch.Tensor:
        """q (B, H, Tq, D) and the scaled, causally masked scores (B, H, Tq, Tk) -> the term added to them."""
        # The counts in float32 whatever the scores' dtype: in bfloat16 (8 significant bits) a sum of gates
        # near 100 moves in steps of 0.5, so the interpolation between the integer positions would be lost.
        gates = torch.sigmoid(scores.float())  # -inf (masked) -> 0
        positions = gates.flip(-1).cumsum(dim=-1).flip(-1).clamp(max=self.cfg.npos - 1)
        floor = positions.floor()
        weight = positions - floor
        logits = q @ self.pos_emb[layer].to(q.dtype)  # (B, H, Tq, npos): z_i[p] for every integer p
        at_floor = logits.gather(-1, floor.long())
        at_ceil = logits.gather(-1, positions.ceil().long())
        return (at_ceil * weight + at_floor * (1 - weight)).to(scores.dtype)
