"""DAPE: data-adaptive positional encoding (Zheng et al. 2024, "DAPE: Data-Adaptive Positional Encoding for Length
Extrapolation", NeurIPS 2024).

A static bias B (KERPLE's or ALiBi's) plus a small MLP that reads, for each pair (i, j), every head's score and
bias together and returns a correction for every head:

    A = softmax(S + B + f(S, B)),   S = Q K^T / sqrt(d)
    f(S, B)_ij = W_2 LeakyReLU(W_1 [S_ij ; B_ij] + b_1) + b_2,   [S_ij ; B_ij] in R^2H,  W_1: 2H -> W,  W_2: W -> H
    B_ij = -r1_h ln(1 + r2_h (i - j))     (``static_bias: kerple``, default: KERPLE's log kernel, kerple.py)
    B_ij = -m_h (i - j)                   (``static_bias: alibi``: ALiBi's slopes, alibi.py)

with S_ij and B_ij the vectors of the H heads' values at (i, j), f one MLP per layer (width W = ``mlp_width``), and
KERPLE's r1, r2 per head and layer, initialised and clamped as kerple.py's (ALiBi's slopes are fixed).

Checked against the paper's reference code, chuanyang-Zheng/DAPE (megatron/model/positional_embeddings.py:
``AliBi_C`` and ``ParallelKerpleLog_C``, run as ``pos-emb`` ``alibi_c`` and ``kerple_c`` by
megatron/model/transformer.py; the same modules in DAPE.py; configs/125M/512/125M_{alibi,kerple}_c.yml): f is
Linear(2H, W), LeakyReLU (slope 0.01), Linear(W, H), with W = 32 and PyTorch's default initialisation; its input
is the scores (already divided by sqrt(d): ``baddbmm`` with alpha 1 / norm_factor, no query-key layer scaling)
followed by the bias, stacked over the heads; it returns scores + B + f, so f corrects the bias and does not
replace it; every layer has its own f (and KERPLE parameters); KERPLE's variant is the log kernel. The causal mask
is applied after f, in the softmax (``scale_mask_softmax``): f reads every pair, and what it gives for j > i is
masked away. Here the written-out path hands ``content_bias`` scores already masked (-inf where j > i): f reads 0
there, and its output there is added to -inf, so it never counts, as in the reference.

Distances by index. Like the reference, which builds B from indices 0..T-1, DAPE counts i - j from the mask: the
keys query i sees from j up to itself, less one (i - j under the causal mask, and within a document when documents
are kept apart; with a KV cache the cached keys count too). So the scheme reads no positions (``uses_positions`` is
false, and ``train.random_positions`` is refused, as for CoPE). The bias needs the scores, so DAPE always runs the
written-out attention path, with its O(T^2) memory per head; f adds (B, Tq, Tk, W) per block of queries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from core.domain import choice, domain
from model.pe.alibi import alibi_slopes
from model.pe.base import ModelDims, PEConfig, PositionalEncoding
from model.pe.capabilities import AttentionMods, CacheSlot, ModifiesAttention
from model.pe.kerple import EPS, clamp_straight_through

STATIC_BIASES = ("kerple", "alibi")


@dataclass
class DAPEConfig(PEConfig):
    name: str = "dape"
    # B: kerple (-r1 ln(1 + r2 (i-j)), learned per head and layer) | alibi (-m_h (i-j))
    static_bias: str = choice("kerple", STATIC_BIASES)
    mlp_width: int = domain(32, ge=1)  # W: f is 2H -> W -> H


def index_distances(visible: torch.Tensor) -> torch.Tensor:
    """(..., Tq, Tk) which keys each query sees -> i - j for each key it sees (0 for the others): the keys it sees
    from j up to itself, less one. The keys a query sees are the run of them ending at itself (the causal mask, a
    document of its own), so the count is its distance by index."""
    return (visible.flip(-1).cumsum(-1).flip(-1) - 1).clamp(min=0)


class DAPEPositionalEncoding(ModifiesAttention, PositionalEncoding):
    name = "dape"
    config_class = DAPEConfig
    modifies = frozenset({"score_mod"})

    def __init__(self, cfg: DAPEConfig, dims: ModelDims) -> None:
        super().__init__(cfg, dims)
        heads = dims.n_head
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(2 * heads, cfg.mlp_width), nn.LeakyReLU(), nn.Linear(cfg.mlp_width, heads))
            for _ in range(dims.n_layer)
        )
        if cfg.static_bias == "kerple":
            # (r1, r2), named as in the reference code and kerple.py
            self.bias_p = nn.Parameter(torch.rand(dims.n_layer, heads) * 2)
            self.bias_a = nn.Parameter(torch.rand(dims.n_layer, heads))
        else:
            self.register_buffer("slopes", torch.tensor(alibi_slopes(heads)), persistent=False)

    def no_weight_decay(self) -> list[nn.Parameter]:
        return [self.bias_p, self.bias_a] if self.cfg.static_bias == "kerple" else []

    def distance_bias(self, distance: torch.Tensor, layer: int) -> torch.Tensor:
        """B at integer distances (..., 1, Tq, Tk) -> (..., H, Tq, Tk), float32 or the parameters' dtype."""
        n = distance.float()
        if self.cfg.static_bias == "alibi":
            return -self.slopes[:, None, None] * n
        r1 = clamp_straight_through(self.bias_p[layer], EPS)[:, None, None]
        r2 = clamp_straight_through(self.bias_a[layer], EPS)[:, None, None]
        return -r1 * torch.log1p(r2 * n)

    def attention_mods(
        self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, layer: int, cache: CacheSlot | None
    ) -> AttentionMods:
        """B + f(S, B) added to the written-out scores of each block of queries."""
        return AttentionMods(score_mod=lambda q, scores: scores + self.content_bias(q, scores, layer))

    def content_bias(self, q: torch.Tensor, scores: torch.Tensor, layer: int) -> torch.Tensor:
        """B + f(S, B) for the scaled, masked scores (B, H, Tq, Tk) of a block of queries."""
        mlp = self.mlps[layer]
        dtype = mlp[0].weight.dtype  # the model's (float32 under bf16 autocast, which then runs f in bf16)
        visible = scores[:, :1] > float("-inf")  # the mask is the same in every head
        bias = self.distance_bias(index_distances(visible), layer).to(dtype)
        features = torch.cat((scores.masked_fill(~visible, 0.0).to(dtype), bias), dim=1)  # (B, 2H, Tq, Tk): S, B
        adaptive = mlp(features.movedim(1, -1)).movedim(-1, 1)
        return (bias + adaptive).to(scores.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, static_bias={self.cfg.static_bias!r}, mlp_width={self.cfg.mlp_width}"
