"""What a positional scheme can do, one small interface each. A scheme inherits the ones it implements, before
:class:`~model.pe.base.PositionalEncoding`:

    class ALiBiPositionalEncoding(DistanceBias, PositionalEncoding): ...

and the model asks ``isinstance`` once, when it is built, to choose each layer's kernel (model/kernels.py,
``choose_kernel``); nothing is declared twice, as a method and as a flag. A scheme that writes one of the hooks
below without its interface is refused when its class is defined (model/pe/base.py), so a hook never goes unread.

Where position enters:

- :class:`PositionEmbedding`: a vector per position added to the token embeddings;
- :class:`Rotation`: q and k transformed in every layer; it may return two rotations merged by distance
  (``score_window``) or q and k wider than v;
- :class:`ScoreBias`: a term added to the scores from (query position, key position, head, layer), written once
  as an elementwise function; refined by :class:`DistanceBias` (a function of q_pos - k_pos alone),
  :class:`LayerwiseBias` (other values in every layer) and :class:`UncompiledScoreBias` (inductor cannot compile
  it into a FlexAttention score_mod);
- :class:`ModifiesAttention`: what the scheme computes per forward pass from the layer's input and hands attention
  (:class:`AttentionMods`): a term per (query, key) (:class:`PairTerm`), a modification of the written-out scores,
  logits in place of q . k, or weights in place of softmax;
- :class:`SlidingWindow`: each query attends its W most recent keys alone (a local layer);

and one that is a faster way to the same numbers: :class:`FusedKernel`, an installed package's kernel for the
scheme's whole attention. The hooks' meaning in full is in model/pe/base.py's docstring.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from core.errors import first_line, warn


class PositionEmbedding:
    """Adds a vector per position to the token embeddings, once, at the input."""

    def embed(self, positions: torch.Tensor) -> torch.Tensor:
        """(T,) integer positions -> (T, n_embd) vectors added to the token embeddings."""
        raise NotImplementedError


class Rotation:
    """Transforms q and k in every attention layer."""

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, seq_len: int, prepared: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The new q and k, both (B, H, T, D), at integer positions (T,) or (B, T), transformed; they may come back
        wider than D (model/pe/base.py, "Wider q and k"). ``seq_len`` is the number of keys attended to (cached ones
        included); ``prepared`` what ``prepare`` returned for this forward pass (computed here when None)."""
        raise NotImplementedError

    def score_window(self) -> int | None:
        """W when ``rotate`` returns a near and a far rotation side by side (model/pe/base.py, "Scores merged by
        distance"); None: one. The model reads it when it resolves its layers' paths, and again when the scheme's
        settings change (``PositionalEncoding.settings_changed``)."""
        return None

    def rotation_depends_on_length(self) -> bool:
        """True when ``rotate`` depends on ``seq_len`` (dynamic NTK): a KV cache then keeps keys unrotated."""
        return False


class ScoreBias:
    """Adds ``score_bias(q_pos, k_pos, head, layer)`` to the (already scaled) scores. Attention turns the one
    elementwise function into a FlexAttention score_mod or a materialised bias block (``bias_block``)."""

    def score_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, head: torch.Tensor, layer: int) -> torch.Tensor:
        """A term added to the (pre-softmax, already scaled) attention score; elementwise, broadcastable."""
        raise NotImplementedError

    def bias_block(self, q_pos: torch.Tensor, k_pos: torch.Tensor, layer: int) -> torch.Tensor:
        """(Tq,) or (B, Tq) query and (Tk,) or (B, Tk) key positions -> (H, Tq, Tk) or (B, H, Tq, Tk) biases."""
        heads = torch.arange(self.dims.n_head, device=q_pos.device)[:, None, None]
        return self.score_bias(q_pos[..., None, :, None], k_pos[..., None, None, :], heads, layer)


class DistanceBias(ScoreBias):
    """A score bias that depends on the positions only through q_pos - k_pos. With positions 0..T-1 attention
    evaluates it once per distance, into a table of (H, T) values per forward pass, that sdpa cuts its mask blocks
    from and, where the bias does not compile (:class:`UncompiledScoreBias`), FlexAttention's score_mod reads."""


class LayerwiseBias(ScoreBias):
    """A score bias with other values in every layer (parameters per layer): its distance table is made per layer,
    not once per forward pass."""


class UncompiledScoreBias(ScoreBias):
    """A score bias that inductor cannot compile into a FlexAttention score_mod with its gradients (an MLP, one
    tensor that needs a gradient indexed twice). Where the score_mod would run it (a bias that is not read from a
    distance table: one that is not a :class:`DistanceBias`, or positions given per token) CUDA runs it through
    sdpa as a mask, block by block; a distance table is read instead where there is one, which compiles."""


class PairTerm:
    """An additive term t_ij on the (scaled) score of query i over key j that is data of one forward pass, not a
    function of positions (a :class:`ScoreBias` is that): computed by a scheme's ``attention_mods`` from the layer's
    input. Every kernel takes it: the written-out path and sdpa's mask blocks add ``block``, FlexAttention runs
    ``score_mod``, and sdpa's causal kernel runs ``folded`` where the term has such a form."""

    def block(self, first: int, last: int, k_stop: int, dtype: torch.dtype) -> torch.Tensor:
        """t of the queries of index first..last-1 among the keys over keys 0..k_stop-1, (B, H, last - first, k_stop),
        in ``dtype``."""
        raise NotImplementedError

    def score_mod(self) -> Callable[..., torch.Tensor]:
        """FlexAttention's score_mod, (score, b, h, q_idx, kv_idx) -> score + t (queries are the keys: no cache)."""
        raise NotImplementedError

    def folded(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
        """The full causal attention of q, k, v with the term, through a causal kernel that takes no mask (the term
        folded into q and k); None where it has no such form (the kernel then takes the term as a mask)."""
        return None


@dataclass
class AttentionMods:
    """What a scheme changes in one layer's attention for one forward pass (:class:`ModifiesAttention`); a field left
    None changes nothing. Only ``pair_term`` has a form every kernel takes; the others run the written-out path."""

    pair_term: PairTerm | None = None
    # (q of a block of queries, their scaled, causally masked scores (B, H, Tq, Tk), -inf where hidden) -> the scores
    # the softmax (or ``weights``) takes: a modification that sees the scores themselves
    score_mod: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    # logits(start, stop): the logits of queries start..stop-1 over every key, (B, H, stop - start, Tk), unscaled, in
    # place of q . k (so that no more rows than a block's exist at once)
    logits: Callable[[int, int], torch.Tensor] | None = None
    # the scaled, masked scores of a block of queries (B, H, Tq, Tk) -> the weights, float32 or wider, that multiply
    # the values in place of softmax(scores); each query's row on its own
    weights: Callable[[torch.Tensor], torch.Tensor] | None = None
    # what a KV cache keeps of this layer's keys in place of the keys themselves (None: the keys)
    cached_keys: torch.Tensor | None = None


# The fields of AttentionMods that only the written-out path takes.
WRITTEN_OUT_MODS = frozenset({"score_mod", "logits", "weights"})


@dataclass
class CacheSlot:
    """A layer's part of a KV cache as ``attention_mods`` sees it: the scheme's own values kept between decoding steps
    (``memo``, one dict per layer and sequence), and ``kept(t, dim)``, what the cache keeps of a tensor whose tokens lie
    along ``dim`` (a cache that drops tokens keeps fewer)."""

    memo: dict
    kept: Callable[..., torch.Tensor]


class ModifiesAttention:
    """Changes a layer's attention with what it computes, per forward pass, from the layer's input: an
    :class:`AttentionMods` (a term per pair, a modification of the written-out scores, logits in place of q . k,
    weights in place of softmax). The fields it fills (``modifies``) are read when the model is built, to choose each
    layer's kernel (model/kernels.py)."""

    modifies: ClassVar[frozenset[str]] = frozenset()

    def attention_mods(
        self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, layer: int, cache: CacheSlot | None
    ) -> AttentionMods:
        """The layer's input x (B, T, C), its new queries q (B, H, Tq, D) and every key k (B, H, Tk, D), cached ones
        first, for the scheme's ``layer`` -> what it changes in this pass; ``cache``: the layer's KV cache (None
        without one)."""
        raise NotImplementedError


class SlidingWindow:
    """Restricts each query to its W most recent keys, itself included: query i attends key j where i - W < j <= i,
    by index as the causal mask is (so under randomized positions, a KV cache or a streaming cache's re-indexed
    positions, W tokens whatever their position labels). Every path applies it: a mask on the written-out path and on
    sdpa's blocks (which then leave out the keys before the window), FlexAttention's block mask, a KV cache's queries
    by their index among the keys."""

    def sliding_window(self) -> int | None:
        """W, the keys each query attends (None: every key before it). The model reads it when it resolves its
        layers' paths, and again when the scheme's settings change (``PositionalEncoding.settings_changed``)."""
        raise NotImplementedError


@functools.cache
def installed_kernel(module: str, name: str) -> Callable[..., Any] | None:
    """``name`` of the module ``module`` of an installed package (a scheme's :class:`FusedKernel`), imported at its
    first use; None where the package or what it needs is not installed (a Triton kernel without Triton), or where it
    fails to import (said once). The written-out path then runs, and the runs' records name it."""
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError:
        return None
    except Exception as error:  # whatever the package raises at import (a driver, a compiler)
        warn(f"{module} cannot be imported ({first_line(error)}); the written-out path runs")
        return None


class FusedKernel:
    """Computes the scheme's whole attention in one pass with an installed package's kernel (a Triton kernel on a
    GPU), where one applies: a kernel of the registry's signature (model/kernels.py), which the layer runs for full
    causal passes, and the written-out path for anything it cannot take (a KV cache, captured probabilities,
    positions per token, a sink)."""

    # The attention backend the runs' records name it by, and (module, name) of the kernel in its package.
    fused_backend: ClassVar[str] = ""
    fused_kernel: ClassVar[tuple[str, str]] = ("", "")
    # The dtypes of q, k and v the kernel takes, forward and backward; a pass in another runs the written-out path
    # (chosen before the pass: a kernel that fails in its backward pass is past any fallback).
    fused_dtypes: ClassVar[frozenset[torch.dtype]] = frozenset({torch.float32, torch.bfloat16, torch.float16})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # imported here, not in the forward pass that torch.compile traces; only where CUDA is (Triton needs it)
        self._kernel = installed_kernel(*self.fused_kernel) if torch.cuda.is_available() else None

    def fused_attention(self, device: torch.device) -> Callable[..., torch.Tensor] | None:
        """A kernel ``kernel(q, k, v, call)`` -> the attention output (B, H, T, Dv) of a full causal pass of q, k, v
        (B, H, T, D) (q scaled by the model's attention temperature), reading the layer's input ``call.x`` (B, T, C)
        and the scheme's index of the layer ``call.layer`` (model/attention.py's AttentionCall), computing what the
        written-out path computes; None where no installed kernel applies on ``device``."""
        raise NotImplementedError


# Each interface's hooks: a scheme that writes one of them inherits the interface (model/pe/base.py checks it).
HOOKS: dict[str, type] = {
    "embed": PositionEmbedding,
    "rotate": Rotation,
    "score_window": Rotation,
    "rotation_depends_on_length": Rotation,
    "score_bias": ScoreBias,
    "bias_block": ScoreBias,
    "attention_mods": ModifiesAttention,
    "fused_attention": FusedKernel,
    "sliding_window": SlidingWindow,
}
