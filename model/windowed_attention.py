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

# Scores per block of queries, all heads and batch rows together: 4 MiB in fp32. Written-out blocks this small stay
# in cache: 4x faster than blocks of model/attention.py's 1 << 24 at 1024 tokens on one CPU thread (measured), and
# the memory beyond the model's activations is a few such blocks.
_BLOCK_SCORES = 1 << 20


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
    # For one product per block giving both scores: the keys with their near half zeroed (for far pairs) and with
    # their far half zeroed (for near pairs), against q's (near, far): each score is q_near . k_near or q_far . k_far.
    far_keys, near_keys = k.clone(), k.clone()
    far_keys[..., :d] = 0
    near_keys[..., d:] = 0
    outputs, probabilities = [], []
    for start in range(0, Tq, block):
        stop = min(Tq, start + block)
        first, k_stop = state.q_offset + start, state.q_offset + stop  # first query's index; keys up to the last's
        near_from, far_to = (0, k_stop) if state.explicit else (max(0, first - window + 1), max(0, k_stop - window))
        far, near = slice(0, far_to), slice(near_from, k_stop)
        keys = torch.cat((far_keys[..., far, :], near_keys[..., near, :]), dim=-2)
        scores = q[..., start:stop, :] @ keys.transpose(-2, -1)
        query_index = key_index[first:k_stop, None]
        query_pos = state.positions[..., start:stop, None]
        allowed = torch.cat(
            (
                (key_index[far] <= query_index) & (query_pos - state.key_positions[..., None, far] >= window),
                (key_index[near] <= query_index) & (query_pos - state.key_positions[..., None, near] < window),
            ),
            dim=-1,
        )
        if allowed.dim() == 3:  # per-row positions: (B, Tq, Tk) -> over the heads
            allowed = allowed[:, None]
        probs = torch.softmax(scores.masked_fill_(~allowed, float("-inf")).float(), dim=-1)
        values = torch.cat((v[..., far, :], v[..., near, :]), dim=-2)
        outputs.append(probs.to(v.dtype) @ values)
        if keep_probs:
            full = probs.new_zeros(*probs.shape[:-1], Tk)
            full[..., far] += probs[..., :far_to]
            full[..., near] += probs[..., far_to:]
            probabilities.append(full.detach())
    return torch.cat(outputs, dim=2), (torch.cat(probabilities, dim=2) if keep_probs else None)
