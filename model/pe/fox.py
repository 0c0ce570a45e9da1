"""FoX: the Forgetting Transformer (Lin, Nikishin, He & Courville 2025, "Forgetting Transformer: Softmax
Attention with a Forget Gate", ICLR 2025, eqs. 5-8): softmax attention with a data-dependent forget gate and no
other position signal (the paper's FoX uses no RoPE: NoPE plus the gate).

In every layer, per head h, a scalar forget gate is computed from the input x_t of the layer's attention (after
its LayerNorm), and the logit of query i over key j <= i is decayed by the product of the gates between them:

    f_t  = sigmoid(w_h^T x_t + b_h)
    D_ij = sum_{l=j+1..i} log f_l  =  c_i - c_j,       c_i = sum_{l<=i} log f_l
    o_i  = sum_{j<=i} softmax_j(q_i^T k_j / sqrt(d) + D_ij) v_j

As in the reference code (zhixuan-lin/forgetting-transformer, ``ForgettingAttentionLayer`` with the default
``fgate_type="full"``):

- the gate is ``fgate_proj = nn.Linear(hidden_size, num_heads, bias=True)`` on the normalised hidden states,
  ``log_fgate = logsigmoid(fgate_logit.float())``, and the bias is ``log_lambda = cumsum(log_fgate)``,
  ``decay_bias = log_lambda[..., -M:, None] - log_lambda[..., None, :]`` (the pure-PyTorch reference in
  ops/forgetting_attention.py's test), in float32;
- initialisation: every ``nn.Linear`` gets weight N(0, initializer_range = 0.02) and bias 0
  (``_init_weights``), so f starts near sigmoid(0) = 1/2, not near 1. The special bias initialisation from
  decay times T_min..T_max (``fgate_bias_init``) is only for the data-independent gates (``bias_only``,
  ``fixed``), not for FoX's. Here the weight is N(0, model.init_std), the bias 0;
- weight decay (``group_parameters``): Linear weights are decayed, biases not (``bias_weight_decay=False``).
  Here the (layer, head, n_embd) weight is a matrix that training/optim.py decays; the bias is declared in
  ``no_weight_decay``;
- decoding: the cache keeps the keys' log f and takes the cumulative sum again; here the cache keeps c of the
  cached keys and goes on from the last one (``cumulative_term``).

Only the forget gate is positional; the paper's "Pro" block additions (output gate, QK-norm, key/value shift,
output norm) change the architecture, not the position signal, and are not part of this scheme.

How it runs. The bias is a term per (query, key), c_i - c_j (:class:`CumulativeTerm`), that this module hands attention
in every layer (``attention_mods``, model/pe/capabilities.py's ``PairTerm``) in each of the forms the kernels take:
blocks added to the written-out scores and to sdpa's mask blocks, a FlexAttention score_mod on GPU, and, in float32
without a cache, the term folded into q and k so that sdpa's causal kernel runs with no mask (``folded``). Token
positions are never read: randomized positions are refused as for NoPE.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.pe.base import ModelDims, PEConfig, PositionalEncoding
from model.pe.capabilities import AttentionMods, CacheSlot, ModifiesAttention, PairTerm


@dataclass
class FoXConfig(PEConfig):
    name: str = "fox"


class ForgetGatePositionalEncoding(ModifiesAttention, PositionalEncoding):
    name = "fox"
    config_class = FoXConfig
    modifies = frozenset({"pair_term"})

    def __init__(self, cfg: FoXConfig, dims: ModelDims) -> None:
        super().__init__(cfg, dims)
        # fgate_proj of every layer: weight (n_head, n_embd), bias (n_head), as the reference initialises them.
        self.gate_weight = nn.Parameter(torch.randn(dims.n_layer, dims.n_head, dims.n_embd) * dims.init_std)
        self.gate_bias = nn.Parameter(torch.zeros(dims.n_layer, dims.n_head))

    def no_weight_decay(self) -> list[nn.Parameter]:
        return [self.gate_bias]

    def cumulative_bias(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """log f_t, (B, H, T) float32, from the layer's input x (B, T, C)."""
        logits = F.linear(x, self.gate_weight[layer], self.gate_bias[layer])
        return F.logsigmoid(logits.float()).transpose(1, 2)

    def attention_mods(
        self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, layer: int, cache: CacheSlot | None
    ) -> AttentionMods:
        if x is None:  # attention outside a model (model/kernels.py's attend): no input, no gate
            return AttentionMods()
        return AttentionMods(pair_term=cumulative_term(self.cumulative_bias(x, layer), cache))


def cumulative_term(terms: torch.Tensor, cache: CacheSlot | None) -> CumulativeTerm:
    """The term c_i - c_j of per-token terms g (B, H, T) of the new tokens, c = cumsum(g) over every key: a KV cache
    keeps c of the cached keys (``cache.memo``), and the sums go on from the last one."""
    sums = terms.float().cumsum(dim=-1)
    if cache is not None:
        previous = cache.memo.get("sums")
        if previous is not None:
            sums = torch.cat((previous, previous[..., -1:] + sums), dim=-1)
        cache.memo["sums"] = cache.kept(sums, dim=-1)
    return CumulativeTerm(sums)


class CumulativeTerm(PairTerm):
    """c_i - c_j for query i over key j, from c of every key, (B, H, Tk) float32."""

    def __init__(self, sums: torch.Tensor) -> None:
        self.sums = sums

    def block(self, first: int, last: int, k_stop: int, dtype: torch.dtype) -> torch.Tensor:
        # c_i - c_j in float32 (c grows along the sequence), then in the scores' dtype.
        return (self.sums[..., first:last, None] - self.sums[..., None, :k_stop]).to(dtype)

    def score_mod(self) -> Callable[..., torch.Tensor]:
        # Read through two tensors: FlexAttention's backward cannot index one tensor that needs a gradient twice
        # (inductor refuses to lower it); autograd adds the clone's gradient back.
        sums, key_sums = self.sums, self.sums.clone()

        def with_sums(score, b, h, q_idx, kv_idx):
            return score + (sums[b, h, q_idx] - key_sums[b, h, kv_idx])

        return with_sums

    def folded(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
        """Causal attention with c_i - c_j folded into two more dimensions of q and k,

            q' = [q, c sqrt(d), sqrt(d)],  k' = [k, 1, -c],  v' = [v, 0, 0]
            =>  q'_i . k'_j / sqrt(d) = q_i . k_j / sqrt(d) + c_i - c_j

        so the fused causal kernel runs with no mask (on CPU a mask that needs a gradient sends sdpa to its unfused
        math kernel, docs/speed.md). float32 only (None otherwise): the dot product adds c_i and -c_j, so its rounding
        grows with |c|; c is first centred on the middle token (the bias is unchanged), which keeps the error near the
        mask path's against float64, while in bfloat16 it would be far too coarse (the mask path runs there)."""
        if q.dtype != torch.float32:
            return None
        d = q.shape[-1]
        root = math.sqrt(d)
        middle = self.sums.shape[-1] // 2
        c = (self.sums - self.sums[..., middle : middle + 1])[..., None].to(q.dtype)
        one, zero = torch.ones_like(c), torch.zeros_like(c)
        q = torch.cat((q, c * root, one * root), dim=-1)
        k = torch.cat((k, one, -c), dim=-1)
        v = torch.cat((v, zero, zero), dim=-1)  # the same head size as q and k: the kernel's fused path needs it
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / root)[..., :d]
