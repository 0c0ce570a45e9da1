"""Attention sinks (``model.attn_sink``): a learned logit per head in every softmax's denominator, for every scheme.

Each head h of each layer has one parameter s_h, a logit with no value (gpt-oss's ``sinks``; Miller 2023's
"softmax off by one" is s_h = 0 fixed), so a query may give attention to nothing:

    out_i = sum_j p_ij v_j,   p_ij = exp(z_ij) / (exp(s_h) + sum_j' exp(z_ij'))

that is softmax([s_h, z_i1, ..., z_in]) with the sink's column dropped. Written with the logsumexp of the
scores, lse_i = log sum_j exp(z_ij), and o_i the output of plain attention:

    out_i = o_i exp(lse_i) / (exp(lse_i) + exp(s_h)) = o_i sigmoid(lse_i - s_h)

Per attention path (model/attention.py), each equal to the formula (tests/model/test_sink.py):
- written-out (``math``, attention capture): the sink column is concatenated to the scores (:func:`with_sink_column`).
- ``flex``: FlexAttention returns lse; the output is o sigmoid(lse - s) (:func:`sink_rescale`).
- ``sdpa`` on CPU, the whole causal sequence (training's path): PyTorch's CPU flash kernel, called directly,
  returns lse (without a gradient through it), and :class:`CpuFlashSink` gives the gradient: its backward is the
  kernel's own with the sink's output y and logsumexp lse' = log(exp(lse) + exp(s)) in place of o and lse. That is
  exact, as flash attention's backward reads the probabilities p' = exp(z - lse') and D = rowsum(dy * y) from
  them, and dy/ds_h = -(1 - sigmoid(lse - s_h)) y. Cost: plain attention's.
- ``sdpa`` otherwise (a mask, a KV cache, CUDA): sdpa does not return lse, so the sink becomes a key: every
  query gets one more coordinate equal to 1, every key a 0 there, and a sink key (0, ..., 0, s_h sqrt(d)) with
  value 0 is put first, so q'.k'_sink / sqrt(d) = s_h for every query and the real scores are unchanged
  (:func:`sink_as_key`). The causal kernel (is_causal) aligns its mask top-left, so the full-sequence path also
  puts a query of zeros first, whose output is dropped: query i + 1 then sees the sink and keys 0 .. i. Autograd
  reaches s through the sink key. The cost: one coordinate more per head and copies of q, k, v, O(T d) against
  attention's O(T^2 d) (0.77x plain attention's forward and backward at T = 512 on CPU; the CPU path above 1.0x).

Initialisation: N(0, model.init_std), as Hugging Face transformers' GptOssPreTrainedModel._init_weights
(``module.sinks.data.normal_(mean=0.0, std=std)``); GPT._init_weights' default for a parameter gives exactly
that. A 1-dimensional parameter, it is not weight-decayed (training/optim.py).
"""

from __future__ import annotations

import math

import torch


def with_sink_column(scores: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """Scores (B, H, Tq, Tk) -> (B, H, Tq, 1 + Tk) with each head's sink logit first."""
    B, H, Tq, _ = scores.shape
    column = sink.to(scores.dtype).view(1, H, 1, 1).expand(B, H, Tq, 1)
    return torch.cat((column, scores), dim=-1)


def sink_rescale(out: torch.Tensor, lse: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """Plain attention's output (B, H, Tq, D) and logsumexp (B, H, Tq) -> the output with the sink."""
    weight = torch.sigmoid(lse.float() - sink.float().view(1, -1, 1))
    return out * weight[..., None].to(out.dtype)


class CpuFlashSink(torch.autograd.Function):
    """Causal attention with a sink on CPU through PyTorch's flash kernel (see the module docstring)."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
        gap = lse.float() - sink.float().view(1, -1, 1)  # lse - s
        y = out * torch.sigmoid(gap)[..., None].to(out.dtype)
        lse_with_sink = lse + torch.nn.functional.softplus(-gap)  # log(exp(lse) + exp(s))
        ctx.save_for_backward(q, k, v, y, lse_with_sink, torch.sigmoid(-gap))
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v, y, lse_with_sink, sink_share = ctx.saved_tensors
        dy = dy.contiguous()
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dy, q, k, v, y, lse_with_sink, 0.0, True
        )
        dsink = -(sink_share * (dy * y).sum(-1).float()).sum(dim=(0, 2))
        return dq, dk, dv, dsink


def sink_as_key(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: torch.Tensor, dummy_query: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v with the sink as a key of index 0 (see the module docstring), for sdpa with
    ``scale=1/sqrt(d)`` (d the original head size). With ``dummy_query`` a query of zeros goes first too."""
    B, H, _, D = q.shape
    q = torch.cat((q, q.new_ones(B, H, q.shape[2], 1)), dim=-1)
    if dummy_query:
        q = torch.cat((q.new_zeros(B, H, 1, D + 1), q), dim=2)
    sink_key = torch.cat(
        (k.new_zeros(B, H, 1, D), (sink * math.sqrt(D)).to(k.dtype).view(1, H, 1, 1).expand(B, H, 1, 1)), -1
    )
    k = torch.cat((sink_key, torch.cat((k, k.new_zeros(B, H, k.shape[2], 1)), dim=-1)), dim=2)
    v = torch.cat((v.new_zeros(B, H, 1, v.shape[-1]), v), dim=2)
    return q, k, v
