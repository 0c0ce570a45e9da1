"""Causal self-attention: the layer (its projections, the scheme's rotation, the temperature, the kernel chosen for
it at build, model/kernels.py; :class:`CausalSelfAttention`), and the attention written out: the formula every kernel
computes, and the one the tests compare them against.

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

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from model.documents import same_document, within_document_index
from model.pe.base import PositionalEncoding, PositionState
from model.pe.capabilities import AttentionMods, CacheSlot, ModifiesAttention
from model.sink import with_sink_column
from model.temperature import AttentionTemperature
from model.windowed_attention import windowed_attention

# A layer's kernel (model/kernels.py's LayerKernel, which imports this module): q, k, v, the call, a capture list.
LayerKernelFn = Callable[..., torch.Tensor]

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
    path, state = call.path, call.state
    _ = call.mods  # the scheme's mods made once, here, outside the blocks that recompute in the backward pass
    if path.window is not None:  # two rotations merged by distance (model/pe/base.py)
        return windowed_attention(q, k, v, state, path.window, keep_probs)
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


@dataclass
class KVCache:
    """Keys and values of every layer for the tokens generated so far. Keys are stored rotated, except for
    schemes whose rotation depends on the length (``Rotation.rotation_depends_on_length``, read into the layer's
    path): those are rotated anew at every step."""

    keys: list[torch.Tensor | None] = field(default_factory=list)
    values: list[torch.Tensor | None] = field(default_factory=list)
    # Per layer, what the scheme's attention_mods keeps between steps (model/pe/capabilities.py, CacheSlot).
    layer_memo: list[dict] = field(default_factory=list)
    pe_memo: dict = field(default_factory=dict)  # the scheme's values fixed for the whole sequence
    # Keys kept unrotated and rotated anew at every step at their positions in the cache, whatever the scheme
    # (a cache that drops tokens, evaluation/streaming.py, re-indexes the positions of those it keeps).
    unrotated: bool = False

    def kept(self, t: torch.Tensor, dim: int = -2) -> torch.Tensor:
        """What the cache keeps of a layer's keys, values or a scheme's values (tokens along ``dim``) after a step:
        all."""
        return t

    @property
    def length(self) -> int:
        return 0 if not self.keys or self.keys[0] is None else self.keys[0].shape[-2]


class AttentionSettings(Protocol):
    """What the layer reads of the model's settings (model/gpt.py's ModelConfig, which imports this module)."""

    n_head: int
    n_embd: int
    bias: bool
    dropout: float
    attn_sink: bool
    attn_gate: bool
    attn_backend: str
    flex_kernel_options: dict[str, Any]
    attn_temperature: Any  # model/temperature.py's TemperatureConfig


class CausalSelfAttention(nn.Module):
    """One layer's attention. The positional scheme is not a submodule: the model owns the scheme (its parameters
    are registered once, as ``pe.*``) and hands each layer's forward the scheme that layer runs (itself, or its
    part for the layer: ``PositionalEncoding.layer_schemes``) with the scheme's own index of the layer."""

    def __init__(self, cfg: AttentionSettings, train_seq_len: int) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.temperature = AttentionTemperature(cfg.attn_temperature, cfg.n_head, train_seq_len)
        self.sink = nn.Parameter(torch.empty(cfg.n_head)) if cfg.attn_sink else None
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        # Gated attention (Qiu et al. 2025, "Gated Attention for Large Language Models", their best variant G1): each
        # head's attention output, before the output projection, times an elementwise gate computed from the same
        # normalised input x that q, k and v come from,
        #     y_h <- y_h * sigmoid(x W_g,h)      W_g: n_embd x (n_head * head_dim), a bias as the q projection has one
        # The reference (qiuzh20/gated_attention, Qwen3) widens q_proj to hold the gate beside each head's query; a
        # separate projection is the same function. It acts on the output alone, so every attention path keeps it.
        self.gate = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias) if cfg.attn_gate else None
        self.dropout = nn.Dropout(cfg.dropout)
        self.backend = cfg.attn_backend
        self.kernel_options = dict(cfg.flex_kernel_options)

    def forward(
        self,
        x: torch.Tensor,
        pe: PositionalEncoding,
        state: PositionState,
        cache: KVCache | None,
        layer: int,
        layer_kernel: LayerKernelFn,
        capture: list[torch.Tensor] | None = None,
        pe_layer: int | None = None,
    ) -> torch.Tensor:
        """``layer``: the model's layer (its KV cache slot); ``layer_kernel``: its attention kernel, chosen when the
        model was built; ``pe_layer``: the scheme's own index of the layer, which selects its per-layer parameters
        (None: ``layer``)."""
        pe_layer = layer if pe_layer is None else pe_layer
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        if cache is not None and (cache.unrotated or layer_kernel.path.rotate_cached_keys):
            # The rotation changes with the length (dynamic NTK): the cache keeps the keys unrotated and all of
            # them are rotated for the current length at every step, so each new token sees every key rotated
            # as a full forward of its length would (docs/sampling.md, "Dynamic NTK with a cache"). Hugging Face reuses
            # keys rotated for shorter lengths instead (transformers issue #25104).
            k, v = self._extend_cache(k, v, cache, layer)
            q = pe.rotate(q, q, state.positions, state.seq_len, state.prepared)[0]
            k = pe.rotate(k, k, state.key_positions, state.seq_len)[1]
        else:
            q, k = pe.rotate(q, k, state.positions, state.seq_len, state.prepared)
            if cache is not None:
                k, v = self._extend_cache(k, v, cache, layer)
        # documents packed into the row: a query attends the keys of its own document so far
        attended = None if state.documents is None else within_document_index(state.documents) + 1
        q = self.temperature(q, state.q_offset, attended)
        slot = None if cache is None else CacheSlot(cache.layer_memo[layer], cache.kept)
        mods = None
        if isinstance(pe, ModifiesAttention):  # computed when a kernel first reads them (a scheme's own needs none)
            mods = functools.partial(pe.attention_mods, x, q, k, pe_layer, slot)
        call = AttentionCall(pe, layer_kernel.path, state, pe_layer, x, self.sink, mods, self.kernel_options, slot)
        y = layer_kernel(q, k, v, call, capture)
        if cache is not None and call.mods.cached_keys is not None:  # what the scheme's cache keeps of the keys
            cache.keys[layer] = cache.kept(call.mods.cached_keys)
        if self.gate is not None:
            y = y * torch.sigmoid(self.gate(x)).view(B, T, self.n_head, -1).transpose(1, 2)
        return self.dropout(self.proj(y.transpose(1, 2).contiguous().view(B, T, C)))

    @staticmethod
    def _extend_cache(
        k: torch.Tensor, v: torch.Tensor, cache: KVCache, layer: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new keys and values to the layer's cache; return all of them (the cache keeps
        ``cache.kept`` of them)."""
        if cache.keys[layer] is not None:
            k = torch.cat((cache.keys[layer], k), dim=2)
            v = torch.cat((cache.values[layer], v), dim=2)
        cache.keys[layer], cache.values[layer] = cache.kept(k), cache.kept(v)
        return k, v
