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
- decoding: the cache keeps the keys' log f and takes the cumulative sum again; here the layer keeps c of the
  cached keys and goes on from the last one (model/gpt.py, ``KVCache.sums``).

Only the forget gate is positional; the paper's "Pro" block additions (output gate, QK-norm, key/value shift,
output norm) change the architecture, not the position signal, and are not part of this scheme.

The bias comes through the base interface's cumulative bias (model/pe/base.py, hook 5): g_t = log f_t per head
and layer. Attention adds c_i - c_j to the mask blocks of sdpa on CPU and in FlexAttention's score_mod on GPU,
so FoX keeps the fast kernels. Token positions are never read: randomized positions are refused as for NoPE.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.pe.base import ModelDims, PEConfig, PositionalEncoding
from model.pe.capabilities import CumulativeBias


@dataclass
class FoXConfig(PEConfig):
    name: str = "fox"


class ForgetGatePositionalEncoding(CumulativeBias, PositionalEncoding):
    name = "fox"
    config_class = FoXConfig

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
