"""Causal self-attention, written out: the formula every kernel of model/kernels.py computes, and the one the tests
compare them against.

    out = softmax(q k^T / sqrt(d) + bias + mask) v

- ``bias``: the scheme's score bias of (query position, key position) (a ``ScoreBias``), read from a table of
  distances where it depends on the distance alone (a ``DistanceBias``), plus the term per (query, key) the scheme
  computed from the layer's input for this pass (``AttentionMods.pair_term``);
- ``mask``: -inf where key j comes after query i (by index), lies in another document (model/documents.py) or before
  a sliding window; with positions per token the bias still reads the positions, the mask the indices;
- what else a scheme changes (model/pe/capabilities.py, ``AttentionMods``): logits in place of q k^T, a modification
  that sees the scaled, masked scores, weights in place of softmax; a sink logit per head adds to the softmax's
  denominator (model/sink.py); two rotations merged by distance run model/windowed_attention.py.

Written one block of queries at a time (rows are independent), so a block's scores, (B, H, block, Tk), bound the
memory; with gradients each block is recomputed in the backward pass. The kernels chosen per layer (sdpa, FlexAttention,
a scheme's own) take this file's mask blocks (:func:`bias_and_mask`) and distance tables where they need them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from core.errors import PosGPTError
from model.documents import same_document
from model.pe.base import PositionalEncoding, PositionState
from model.pe.capabilities import AttentionMods, CacheSlot
from model.sink import with_sink_column
from model.windowed_attention import windowed_attention

# Upper bound on materialised scores (written-out path) or mask entries (sdpa with a bias) per block of queries, in
# elements, all heads and batch rows together: 64 MiB in fp32.
_MAX_BLOCK_SCORES = 1 << 24

# Queries per block of the written-out path while it keeps gradients, when the queries make more than one block: each
# block is computed without keeping anything for backward and computed again in the backward pass
# (torch.utils.checkpoint), so its scores, gates and probabilities exist for one block at a time, O(block x Tk) per
# head, not the O(Tq x Tk) of every layer kept until the backward pass; the price is the forward once more
# (docs/speed.md, "The written-out path's recomputed blocks"). FlexAttention's block size.
_RECOMPUTED_BLOCK = 128

NO_MODS = AttentionMods()


@dataclass(frozen=True)
class AttentionPath:
    """One layer's attention as resolved when the model is built (model/kernels.py, ``choose_kernel``): the kernel a
    full pass runs and what the bias and mask read."""

    runs: str  # a full causal pass with positions 0..T-1: a kernel of the registry or the scheme's own
    explicit_runs: str  # the same with positions given per token (no distance table stands in for the bias)
    score_bias: bool = False  # the scheme's score_bias is added (mask blocks, score_mod)
    distance_table: bool = False  # with positions 0..T-1 the bias is read from its table per distance
    table_per_layer: bool = False  # ... made once per layer, not once per forward pass
    table_in_score_mod: bool = False  # FlexAttention's score_mod reads the table (the bias itself does not compile)
    modifies: frozenset[str] = frozenset()  # the fields of AttentionMods the scheme fills
    window: int | None = None  # scores merged from two rotations by distance (model/windowed_attention.py)
    rotate_cached_keys: bool = False  # the rotation depends on the length: a KV cache keeps keys unrotated
    own: str | None = None  # the scheme's own kernel for a full causal pass (its fused_backend), where it runs
    sliding_window: int | None = None  # each query attends its W most recent keys alone (SlidingWindow)

    def describe(self) -> str:
        """One line for the model summary: the kernel, and what it reads besides q, k and v."""
        parts = [self.runs]
        if self.explicit_runs != self.runs:
            parts[0] += f" ({self.explicit_runs} with per-token positions)"
        extras = {
            f"sliding window {self.sliding_window}": self.sliding_window is not None,
            "windowed scores": self.window is not None,
            "distance table" + (" per layer" if self.table_per_layer else ""): self.distance_table,
            "score bias": self.score_bias and not self.distance_table,
        }
        mods = [f"its {name.replace('_', ' ')}" for name in sorted(self.modifies)]
        return ", ".join(parts + [name for name, used in extras.items() if used] + mods)


class AttentionCall:
    """One layer's attention in one forward pass, besides q, k and v: what every kernel gets. ``mods``: the scheme's
    changes for this pass, or a function that computes them, called at the first read (a scheme's own kernel that
    computes the whole attention never needs them); ``cache``: the layer's KV-cache slot (None without a cache)."""

    def __init__(
        self,
        pe: PositionalEncoding,
        path: AttentionPath,
        state: PositionState,
        layer: int = 0,
        x: torch.Tensor | None = None,
        sink: torch.Tensor | None = None,
        mods: AttentionMods | Callable[[], AttentionMods] | None = None,
        kernel_options: Mapping[str, Any] | None = None,
        cache: CacheSlot | None = None,
    ) -> None:
        self.pe, self.path, self.state, self.layer, self.x, self.sink = pe, path, state, layer, x, sink
        self.cache = cache
        self.kernel_options = kernel_options or None
        self._mods = NO_MODS if mods is None else mods

    @property
    def mods(self) -> AttentionMods:
        if not isinstance(self._mods, AttentionMods):
            self._mods = self._mods()
        return self._mods


def default_state(
    pe: PositionalEncoding, n_queries: int, n_keys: int, device: torch.device, memo: dict | None = None
) -> PositionState:
    """Queries at positions n_keys - n_queries .. n_keys - 1 over keys at 0 .. n_keys - 1 (no explicit positions)."""
    q_offset = n_keys - n_queries
    positions = torch.arange(q_offset, n_keys, device=device)
    return PositionState(
        positions,
        torch.arange(n_keys, device=device),
        q_offset,
        pe.prepare(positions, n_keys, {} if memo is None else memo),
    )


def written_out_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall, keep_probs: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q: (B, H, Tq, D), the last Tq of the keys; k, v: (B, H, Tk, D) -> (output (B, H, Tq, Dv), and with
    ``keep_probs`` the probabilities, float32 (B, H, Tq, Tk))."""
    path, state, sink, mods = call.path, call.state, call.sink, call.mods  # the scheme's mods made once, here
    if path.window is not None:  # two rotations merged by distance (model/pe/base.py)
        if sink is not None:
            raise PosGPTError(
                "model.attn_sink: the written-out attention that merges two rotations by distance has no sink "
                "logit; evaluate this run without that variation"
            )
        return windowed_attention(q, k, v, state, path.window, keep_probs)
    if mods.weights is not None and sink is not None:
        raise PosGPTError(
            f"model.attn_sink: pe={call.pe.name} weighs the values by its own rule, not a softmax, so there is no "
            "denominator for a sink logit; train without model.attn_sink"
        )
    Tq = q.shape[-2]
    block = query_block(q, k)
    grad = not keep_probs and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    recompute = grad and Tq > min(block, _RECOMPUTED_BLOCK)  # a single block is kept: recomputing it costs only time
    if recompute:
        block = min(block, _RECOMPUTED_BLOCK)
        if path.distance_table and not state.explicit:
            distance_bias(call)  # made once, outside the recomputed blocks, which then all read it
    outputs, probabilities = [], []
    for start in range(0, Tq, block):
        args = (q, k, v, call, start, min(Tq, start + block))
        if recompute:
            out, probs = checkpoint(_written_out_block, *args, use_reentrant=False)
        else:
            out, probs = _written_out_block(*args)
        outputs.append(out)
        if keep_probs:
            probabilities.append(probs.detach())
    return torch.cat(outputs, dim=2), (torch.cat(probabilities, dim=2) if keep_probs else None)


def _written_out_block(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall, start: int, stop: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention of queries start..stop-1 over every key: (output, probabilities). A pure function of its
    arguments (it may read the per-forward tables of ``call.state``, never add to them), so that it can run again in
    the backward pass."""
    mods = call.mods
    q_block = q[:, :, start:stop]
    products = q_block @ k.transpose(-2, -1) if mods.logits is None else mods.logits(start, stop)
    scores = products / math.sqrt(q.shape[-1])
    scores = scores + bias_and_mask(call, start, stop, k.shape[-2], scores.dtype)
    if mods.score_mod is not None:
        scores = mods.score_mod(q_block, scores)
    if mods.weights is not None:
        probs = mods.weights(scores)
    elif call.sink is None:
        probs = torch.softmax(scores.float(), dim=-1)
    else:
        probs = torch.softmax(with_sink_column(scores, call.sink).float(), dim=-1)[..., 1:]
    return probs.to(q.dtype) @ v, probs


def bias_and_mask(call: AttentionCall, start: int, stop: int, k_stop: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask for queries start..stop-1 over keys 0..k_stop-1: the scheme's bias where key <= query, -inf
    elsewhere; (H, Tq, Tk), (B, H, Tq, Tk) with per-row positions or a pair term, or (1, Tq, Tk) without a bias."""
    state, path = call.state, call.path
    mask = _score_bias_and_mask(call, start, stop, k_stop, dtype)
    if state.documents is not None:  # -inf across documents too (model/documents.py): (B, H or 1, Tq, Tk)
        queries = slice(state.q_offset + start, state.q_offset + stop)
        same = same_document(state.documents, queries, slice(0, k_stop))[:, None]
        mask = torch.where(same, mask, float("-inf"))
    if path.sliding_window is not None:  # -inf before the window too: key j <= i - W
        mask = mask.masked_fill(_before_window(state, start, stop, k_stop, path.sliding_window), float("-inf"))
    term = call.mods.pair_term
    if term is None:
        return mask
    return mask + term.block(state.q_offset + start, state.q_offset + stop, k_stop, dtype)  # -inf stays -inf


def _before_window(state: PositionState, start: int, stop: int, k_stop: int, window: int) -> torch.Tensor:
    """(Tq, Tk) bool: whether key j (0..k_stop-1) lies before the sliding window of query i (index q_offset + start
    .. q_offset + stop - 1 among the keys), j <= i - W."""
    device = state.positions.device
    query_index = torch.arange(state.q_offset + start, state.q_offset + stop, device=device)
    return torch.arange(k_stop, device=device)[None, :] <= query_index[:, None] - window


def _score_bias_and_mask(call: AttentionCall, start: int, stop: int, k_stop: int, dtype: torch.dtype) -> torch.Tensor:
    """:func:`bias_and_mask` of the causal mask and the score bias alone."""
    state, path = call.state, call.path
    if path.distance_table and not state.explicit:
        return _relative_block(call, start, stop, k_stop, dtype)
    device = state.positions.device
    query_index = torch.arange(state.q_offset + start, state.q_offset + stop, device=device)
    causal = torch.arange(k_stop, device=device)[None, :] <= query_index[:, None]
    if path.score_bias:
        bias = call.pe.bias_block(state.positions[..., start:stop], state.key_positions[..., :k_stop], call.layer)
        bias = bias.to(dtype)
    else:
        bias = torch.zeros((1,) + causal.shape, dtype=dtype, device=device)
    return bias.masked_fill(~causal, float("-inf"))


def _relative_block(call: AttentionCall, start: int, stop: int, k_stop: int, dtype: torch.dtype) -> torch.Tensor:
    """The mask of :func:`bias_and_mask` for a bias that depends only on the distance d = query - key (a
    ``DistanceBias``), cut from its table per distance (:func:`distance_bias`).

    Reversed and padded, the table holds, per head, the bias at d = Tk-1, Tk-2, ..., 0 followed by Tk-1 entries of
    -inf (d < 0): query a's row over keys 0..k-1 is the window starting at Tk-1-a, so a block of queries is a window
    view of it, read backwards (one copy). The padded copy, (H, 2 Tk - 1), is made per block, so nothing but the
    table is cached (a block recomputed in the backward pass must find the same cache as its first run)."""
    state = call.state
    n_keys = state.seq_len
    bias = distance_bias(call).flip(-1).to(dtype)  # (H, Tk): d = Tk-1 .. 0
    table = torch.cat((bias, bias.new_full((bias.shape[0], n_keys - 1), float("-inf"))), dim=-1)
    first, last = state.q_offset + start, state.q_offset + stop  # absolute indices of the block's queries
    windows = table.unfold(-1, k_stop, 1)  # (H, 2Tk-k_stop, k_stop): window s = entries s .. s+k_stop-1
    return windows[:, n_keys - last : n_keys - first].flip(-2)


def distance_bias(call: AttentionCall) -> torch.Tensor:
    """(H, Tk): the bias of a ``DistanceBias`` at distances d = 0 .. Tk-1, evaluated by the scheme's own
    ``bias_block`` once per forward pass, or once per layer when it depends on the layer, and kept in
    ``state.bias_blocks``. It keeps its autograd graph: gradients of the scores that read it (sdpa's mask blocks,
    FlexAttention's score_mod) reach the scheme's parameters through it."""
    state, path = call.state, call.path
    key = ("distance", call.layer if path.table_per_layer else None)
    table = state.bias_blocks.get(key)
    if table is None:
        distances = torch.arange(state.seq_len, device=state.positions.device)
        table = state.bias_blocks[key] = call.pe.bias_block(distances, distances[:1], call.layer)[..., 0]
    return table


def query_block(q: torch.Tensor, k: torch.Tensor) -> int:
    """Queries per block, so that a block's scores stay within _MAX_BLOCK_SCORES elements."""
    B, H, Tq, _ = q.shape
    return max(1, min(Tq, _MAX_BLOCK_SCORES // max(1, B * H * k.shape[-2])))
