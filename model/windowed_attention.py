"""Attention whose scores come from two rotations of q and k, chosen by distance (model/pe/base.py, "Scores merged
by distance"; RoPE's Self-Extend and ReRoPE, model/pe/rope_remap.py):

    s(i, j) = q_near_i . k_near_j / sqrt(d)   where 0 <= pos_i - pos_j < W
              q_far_i  . k_far_j  / sqrt(d)   where pos_i - pos_j >= W
    out_i   = sum_j softmax_j(s(i, j)) v_j    over the keys j <= i (by index)

q and k hold (near, far) side by side on their last dimension (2d); v has d. Written out, one block of queries
at a time (rows are independent), so memory stays at O(block x T) per head for long sequences. Within a block,
only the keys that can be near (the last W + block ones) are scored with the near rotation and only those that
can be far (all but the last W) with the far one, so the work is that of one score matrix, not two: with the
default positions (index = position) a key is near for some query of the block only if its index is at least
(first query) - W + 1, and far only if it is at most (last query) - W. With explicit positions (increasing, with
gaps) both cover every key up to the block's last query. Where the two ranges overlap, the distance masks give
each key one score, never two.
"""

from __future__ import annotations

import math

import torch

from model.pe.base import PositionState


def windowed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: PositionState,
    window: int,
    block: int,
    keep_probs: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q: (B, H, Tq, 2d), the last Tq of the keys; k: (B, H, Tk, 2d); v: (B, H, Tk, d). Returns the output
    (B, H, Tq, d) and, with ``keep_probs``, the float32 probabilities (B, H, Tq, Tk)."""
    d, Tq, Tk = v.shape[-1], q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(d)
    device = q.device
    outputs, probabilities = [], []
    for start in range(0, Tq, block):
        stop = min(Tq, start + block)
        first, k_stop = state.q_offset + start, state.q_offset + stop  # first query's index; keys up to the last's
        near_from, far_to = (0, k_stop) if state.explicit else (max(0, first - window + 1), max(0, k_stop - window))
        query_index = torch.arange(first, k_stop, device=device)[:, None]
        query_pos = state.positions[..., start:stop, None]
        parts = []
        for rotation, keys in ((1, slice(0, far_to)), (0, slice(near_from, k_stop))):
            dims = slice(rotation * d, (rotation + 1) * d)  # far: the second half
            q_part, k_part = q[..., start:stop, dims], k[..., keys, dims]
            distance = query_pos - state.key_positions[..., None, keys]
            allowed = (torch.arange(Tk, device=device)[keys] <= query_index) & ((distance >= window) == bool(rotation))
            if allowed.dim() == 3:  # per-row positions: (B, Tq, Tk) -> over the heads
                allowed = allowed[:, None]
            scores = (q_part @ k_part.transpose(-2, -1)) * scale
            parts.append(scores.masked_fill(~allowed, float("-inf")))
        probs = torch.softmax(torch.cat(parts, dim=-1).float(), dim=-1)
        far_probs, near_probs = probs[..., :far_to].to(v.dtype), probs[..., far_to:].to(v.dtype)
        outputs.append(far_probs @ v[..., :far_to, :] + near_probs @ v[..., near_from:k_stop, :])
        if keep_probs:
            full = probs.new_zeros(*probs.shape[:-1], Tk)
            full[..., :far_to] += probs[..., :far_to]
            full[..., near_from:k_stop] += probs[..., far_to:]
            probabilities.append(full.detach())
    return torch.cat(outputs, dim=2), (torch.cat(probabilities, dim=2) if keep_probs else None)
