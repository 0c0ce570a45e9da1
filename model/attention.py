"""Causal self-attention kernels, one entry point for every positional scheme.

    attend(q, k, v, pe, backend, q_offset) = softmax(q k^T / sqrt(d) + bias + causal mask) v

Backends (``model.attn_backend``):
- ``sdpa``: PyTorch's scaled_dot_product_attention. Without a score bias and without a KV cache it runs with
  ``is_causal=True`` and no mask, so the flash kernel is used on GPU (and the fused flash kernel on CPU).
  With a bias (ALiBi, ...) it is given the bias as a float mask, materialised one block of queries at a
  time so memory stays at O(block x T) per head instead of O(T^2): this is the CPU path for bias schemes.
- ``flex``: FlexAttention with the scheme's bias as a ``score_mod`` and a causal block mask; nothing is
  materialised (CUDA, compiled). On CPU, torch 2.13 runs FlexAttention forward only (eager and unfused,
  for checking), so training there with ``flex`` is refused with a clear error.
- ``math``: the plain formula, written out; the reference the tests compare every backend against.
- ``auto``: flex for bias schemes on CUDA, sdpa otherwise.

With a KV cache (queries not starting at position 0) flex falls back to the blockwise sdpa path.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from core.errors import PosGPTError
from model.pe.base import PositionalEncoding

BACKENDS = ("auto", "sdpa", "flex", "math")

# Upper bound on materialised scores per block (elements, all heads and batch rows together).
_MAX_BLOCK_SCORES = 1 << 26

# The list capture_attention() collects probabilities into; None (the default) costs attend() one check.
_captured: list[torch.Tensor] | None = None


@contextlib.contextmanager
def capture_attention() -> Iterator[list[torch.Tensor]]:
    """Inside it, every ``attend`` runs the math path and appends its attention probabilities, a float32
    (B, H, Tq, Tk) tensor, to the yielded list, in layer order (for diagnostics; training never enters it)."""
    global _captured
    outer, _captured = _captured, []
    try:
        yield _captured
    finally:
        _captured = outer


def resolve_backend(backend: str, pe: PositionalEncoding, device: torch.device) -> str:
    """The backend that will actually run for this scheme on this device."""
    if backend not in BACKENDS:
        raise PosGPTError(f"unknown model.attn_backend={backend!r}; choose one of {list(BACKENDS)}")
    if backend == "auto":
        return "flex" if pe.has_score_bias and device.type == "cuda" else "sdpa"
    return backend


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pe: PositionalEncoding,
    backend: str,
    q_offset: int = 0,
) -> torch.Tensor:
    """q: (B, H, Tq, D) at positions q_offset .. q_offset+Tq-1; k, v: (B, H, Tk, D) at positions 0 .. Tk-1."""
    if _captured is not None:
        probs = _math_probabilities(q, k, pe, q_offset)
        _captured.append(probs)
        return probs.to(q.dtype) @ v
    backend = resolve_backend(backend, pe, q.device)
    if backend == "math":
        return _math_attention(q, k, v, pe, q_offset)
    if backend == "flex" and q_offset == 0 and q.shape[-2] == k.shape[-2]:
        if q.device.type == "cpu" and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise PosGPTError(
                "model.attn_backend=flex cannot train on CPU: FlexAttention has no CPU backward in this "
                "PyTorch. Use model.attn_backend=auto (or sdpa) on CPU."
            )
        return _flex_attention(q, k, v, pe)
    if not pe.has_score_bias and q_offset == 0 and q.shape[-2] == k.shape[-2]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return _blockwise_sdpa(q, k, v, pe, q_offset)


def _bias_and_mask(
    pe: PositionalEncoding, q_pos: torch.Tensor, k_pos: torch.Tensor, n_head: int, dtype: torch.dtype
) -> torch.Tensor:
    """(H, Tq, Tk) additive mask: the scheme's bias where key <= query, -inf elsewhere."""
    q_pos, k_pos = q_pos[:, None], k_pos[None, :]
    causal = k_pos <= q_pos
    if pe.has_score_bias:
        heads = torch.arange(n_head, device=q_pos.device)[:, None, None]
        bias = pe.score_bias(q_pos, k_pos, heads).to(dtype)
    else:
        bias = torch.zeros((1,) + causal.shape, dtype=dtype, device=q_pos.device)
    return bias.masked_fill(~causal, float("-inf"))


def _math_probabilities(q, k, pe, q_offset):
    """softmax(q k^T / sqrt(d) + bias + causal mask) in float32: (B, H, Tq, Tk)."""
    B, H, Tq, D = q.shape
    q_pos = torch.arange(q_offset, q_offset + Tq, device=q.device)
    k_pos = torch.arange(k.shape[-2], device=q.device)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(D)
    scores = scores + _bias_and_mask(pe, q_pos, k_pos, H, scores.dtype)
    return torch.softmax(scores.float(), dim=-1)


def _math_attention(q, k, v, pe, q_offset):
    return _math_probabilities(q, k, pe, q_offset).to(q.dtype) @ v


def _blockwise_sdpa(q, k, v, pe, q_offset):
    B, H, Tq, D = q.shape
    Tk = k.shape[-2]
    block = max(1, min(Tq, _MAX_BLOCK_SCORES // max(1, B * H * Tk)))
    k_pos = torch.arange(Tk, device=q.device)
    outputs = []
    for start in range(0, Tq, block):
        stop = min(Tq, start + block)
        q_pos = torch.arange(q_offset + start, q_offset + stop, device=q.device)
        # Keys after the last query of the block are masked anyway: slice them off to save work.
        k_stop = min(Tk, q_offset + stop)
        mask = _bias_and_mask(pe, q_pos, k_pos[:k_stop], H, q.dtype)
        outputs.append(
            F.scaled_dot_product_attention(q[:, :, start:stop], k[:, :, :k_stop], v[:, :, :k_stop], attn_mask=mask)
        )
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)


@functools.cache
def _compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _causal_block_mask(seq_len: int, device: str):
    """The causal BlockMask: cached in eager mode; under torch.compile its (cheap) construction is traced
    into the graph instead, as dynamo would ignore the cache anyway (with a warning)."""
    if torch.compiler.is_compiling():
        return _make_causal_block_mask(seq_len, device)
    return _cached_causal_block_mask(seq_len, device)


def _make_causal_block_mask(seq_len: int, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(_causal, B=None, H=None, Q_LEN=seq_len, KV_LEN=seq_len, device=device)


_cached_causal_block_mask = functools.lru_cache(maxsize=32)(_make_causal_block_mask)


def _flex_attention(q, k, v, pe):
    def score_mod(score, b, h, q_idx, kv_idx):
        return score + pe.score_bias(q_idx, kv_idx, h)

    score_mod = score_mod if pe.has_score_bias else None
    block_mask = _causal_block_mask(q.shape[-2], str(q.device))
    return _flex_kernel(q.device)(q, k, v, score_mod=score_mod, block_mask=block_mask)


def _flex_kernel(device: torch.device):
    """Compiled flex_attention on CUDA (the fused kernel). Inside an enclosing torch.compile (the training
    model) the plain function, which the outer compilation fuses; on CPU too (forward only, unfused)."""
    from torch.nn.attention.flex_attention import flex_attention

    if device.type == "cuda" and not torch.compiler.is_compiling():
        return _compiled_flex_attention()
    return flex_attention
