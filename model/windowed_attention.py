"""Attention whose scores come from two rotations of q and k, chosen by distance (model/pe/base.py, "Scores merged
by distance": a rotation's remapped distances):

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
each key one score, never two. The softmax runs over both parts without joining them (a copy per block): the
row's maximum and normaliser are taken over both.
"""

from __future__ import annotations

import math

import torch

from model.documents import same_document
from model.pe.base import PositionState

# Scores per block of queries, all heads and batch rows together: 8 MiB in fp32. Written-out blocks this small stay
# in cache (docs/speed.md, "Measurements behind the attention kernels"), and the memory beyond the model's
# activations is a few such blocks.
_BLOCK_SCORES = 1 << 21


def windowed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: PositionState,
    window: int,
    keep_probs: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q: (B, H, Tq, 2d), the last Tq of the keys; k: (B, H, Tk, 2d); v: (B, H, Tk, d). Returns the output
    (B, H, Tq, d) and, with ``keep_probs``, the float32 probabilities (B, H, Tq, Tk)."""
    (B, H, Tq, _), d, Tk = q.shape, v.shape[-1], k.shape[-2]
    block = max(1, min(Tq, _BLOCK_SCORES // (B * H * Tk)))
    q = q / math.sqrt(d)  # scaled once here, not in every block's scores
    key_index = torch.arange(Tk, device=q.device)
    outputs, probabilities = [], []
    for start in range(0, Tq, block):
        stop = min(Tq, start + block)
        first, k_stop = state.q_offset + start, state.q_offset + stop  # first query's index; keys up to the last's
        near_from, far_to = (0, k_stop) if state.explicit else (max(0, first - window + 1), max(0, k_stop - window))
        query_index = key_index[first:k_stop, None]
        query_pos = state.positions[..., start:stop, None]
        # The softmax over both parts together, without joining them (a copy per block): exp(s - m) / Z with the
        # row's maximum m and normaliser Z taken over both.
        parts = []
        for rotation, keys in ((1, slice(0, far_to)), (0, slice(near_from, k_stop))):
            half = slice(rotation * d, (rotation + 1) * d)  # far: the second half of q and k
            scores = (q[..., start:stop, half] @ k[..., keys, half].transpose(-2, -1)).float()
            distance = query_pos - state.key_positions[..., None, keys]
            allowed = (key_index[keys] <= query_index) & ((distance >= window) == bool(rotation))
            if state.documents is not None:  # and within the query's document (model/documents.py)
                allowed = allowed & same_document(state.documents, slice(first, k_stop), keys)
            parts.append(scores.masked_fill_(~(allowed[:, None] if allowed.dim() == 3 else allowed), float("-inf")))
        far_scores, near_scores = parts
        top = near_scores.amax(-1, keepdim=True)  # finite: a query is near itself
        if far_to:
            top = torch.maximum(top, far_scores.amax(-1, keepdim=True))
        far_scores, near_scores = (far_scores - top).exp(), (near_scores - top).exp()
        total = far_scores.sum(-1, keepdim=True) + near_scores.sum(-1, keepdim=True)
        out = far_scores.to(v.dtype) @ v[..., :far_to, :] + near_scores.to(v.dtype) @ v[..., near_from:k_stop, :]
        outputs.append(out / total.to(v.dtype))
        if keep_probs:
            full = far_scores.new_zeros(*far_scores.shape[:-1], Tk)
            full[..., :far_to] += far_scores / total
            full[..., near_from:k_stop] += near_scores / total
            probabilities.append(full.detach())
    return torch.cat(outputs, dim=2), (torch.cat(probabilities, dim=2) if keep_probs else None)
