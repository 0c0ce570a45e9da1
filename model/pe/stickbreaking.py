"""Stick-breaking attention (Tan, Yang, Courville, Panda & Shen 2025, "Scaling Stick-Breaking Attention: An Efficient
Implementation and In-Depth Study", ICLR 2025, sec. 2): no position encoding and no softmax. Query i breaks a stick of
length 1 over the keys before it, nearest first: key j takes the fraction beta_ij of what the nearer keys left,

    z_ij    = q_i . k_j / sqrt(d),      beta_ij = sigmoid(z_ij)
    A_ij    = beta_ij prod_{j<k<i} (1 - beta_ik)        for j < i, and 0 for j >= i
    o_i     = sum_{j<i} A_ij v_j

so order enters through the product alone: a key's weight shrinks with every nearer key that took a piece, not with a
position. As in the paper's kernel, computed in log space (log(1 - sigmoid(z)) = log sigmoid(-z) = -softplus(z)):

    log A_ij = log sigmoid(z_ij) + sum_{j<k<i} log sigmoid(-z_ik)

where the sum is a cumulative sum over the keys taken from the query backwards, in float32 (float64 stays float64)
whatever the scores' dtype; the weights are then exp of it, never a product of many small factors.

The diagonal and the remainder, as in the references (github shawntan/stickbreaking-attention, the paper's Triton
kernels, and flash-linear-attention's ``fla/ops/stickbreaking_attn``): a query does not attend to itself by default
(their ``attend_current=False``; ``pe.attend_current=true`` lets its own key break the stick first, j <= i above).
The weights of a query sum to 1 - prod_{j<i} (1 - beta_ij) <= 1; the rest of the stick (their ``rem``) weighs nothing
here, as in fla's ``StickBreakingAttention`` layer. The kernels' own tests add it to the query's own value instead
(o_i + rem_i v_i), and IBM's lm-engine adds it to a learned vector per head; neither is part of this scheme. Query 0
(no key before it) outputs 0: the residual stream carries it.

How it runs. The weights replace softmax: this module hands attention ``attention_weights`` as the layer's
``AttentionMods.weights`` (model/pe/capabilities.py), and the written-out path (model/attention.py, on every device and
backend) computes the scaled scores block by block of queries, causally masked (-inf), and multiplies the values by
what it returns. Rows are independent, so the blocks bound memory at long evaluation lengths (about 64 MiB of scores per
block, a few copies of it while the weights are computed), and a KV cache works as for any scheme: the new queries
see every cached key. There is no softmax denominator, so an attention sink (``model.attn_sink``) is refused. Token
positions are never read: randomized positions are refused as for NoPE.

On CUDA with flash-linear-attention installed (PyPI ``fla-core``), a full causal pass (training, scoring) runs its
Triton kernel instead (``parallel_stickbreaking_attn``, the paper's algorithm; ``fused_attention``, a kernel of
model/kernels.py's signature), recorded as ``attn_backend=fla``; decoding from a KV cache runs the written-out path.
tests/model/test_kernels_fused_attention.py compares the two, the kernel run by Triton's CPU interpreter and on CUDA.
Its cost against RoPE's is in docs/speed.md ("Stick-breaking attention").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from model.pe.base import PEConfig, PositionalEncoding
from model.pe.capabilities import AttentionMods, CacheSlot, FusedKernel, ModifiesAttention


@dataclass
class StickBreakingConfig(PEConfig):
    name: str = "stickbreaking"
    # false: a query weighs only the keys before it (the paper, and the references' default); true: its own key
    # breaks the stick first (the reference kernels' attend_current)
    attend_current: bool = False


class StickBreakingPositionalEncoding(ModifiesAttention, FusedKernel, PositionalEncoding):
    name = "stickbreaking"
    config_class = StickBreakingConfig
    modifies = frozenset({"weights"})
    fused_backend = "fla"
    fused_kernel = ("fla.ops.stickbreaking_attn", "parallel_stickbreaking_attn")

    def fused_attention(self, device: torch.device) -> Callable[..., torch.Tensor] | None:
        """flash-linear-attention's Triton kernel of these weights (``parallel_stickbreaking_attn``, module docstring),
        on CUDA where it is installed and takes the head size (at most 256)."""
        kernel = self._kernel
        if device.type != "cuda" or kernel is None or self.dims.head_dim > 256:
            return None

        def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call) -> torch.Tensor:
            layout = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # the kernel's (B, T, H, D)
            out, _ = kernel(*layout, scale=q.shape[-1] ** -0.5, attend_current=self.cfg.attend_current)
            return out.transpose(1, 2)  # the rest of the stick (its second output) weighs nothing, as here

        return attention

    def attention_mods(
        self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, layer: int, cache: CacheSlot | None
    ) -> AttentionMods:
        return AttentionMods(weights=lambda scores: self.attention_weights(scores, layer))

    def attention_weights(self, scores: torch.Tensor, layer: int) -> torch.Tensor:
        """A_ij of the module docstring, (B, H, Tq, Tk) float32 (float64 for float64 scores), from the scaled scores
        of a block of queries, -inf where the causal mask hides a key."""
        z = scores if scores.dtype == torch.float64 else scores.float()
        if not self.cfg.attend_current:
            # The query's own key is the last key it sees (the causal mask is by index): hide it too. A key is
            # hidden when the next one is (the last key of the block never lies before a query).
            own = torch.ones_like(z, dtype=torch.bool)
            own[..., :-1] = z[..., 1:] == float("-inf")
            z = z.masked_fill(own, float("-inf"))
        # log A_ij = log sigmoid(z_ij) + sum_{j<k<i} log sigmoid(-z_ik) = z_ij + sum_{j<=k<i} log sigmoid(-z_ik), as
        # log sigmoid(z) = z + log sigmoid(-z): one logsigmoid and a cumulative sum over the keys from the query
        # backwards, so the nearest keys' sums are short and exact. A hidden key (z = -inf) adds log sigmoid(inf) =
        # 0 to the sums (it breaks nothing off the stick) and gets exp(-inf) = 0, with zero gradients, not NaN.
        # In place after the first copy: neither cumsum's nor add's backward reads its input, exp's reads its output,
        # and each fresh T x T allocation would fault in new pages (docs/speed.md, "Stick-breaking attention").
        log_rest = F.logsigmoid(-z)
        return log_rest.flip(-1).cumsum_(-1).flip(-1).add_(z).exp_()
