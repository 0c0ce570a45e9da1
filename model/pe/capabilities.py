"""What a positional scheme can do, one small interface each. A scheme inherits the ones it implements, before
:class:`~model.pe.base.PositionalEncoding`:

    class ALiBiPositionalEncoding(DistanceBias, PositionalEncoding): ...

and attention asks ``isinstance`` once, when the model is built, to choose each layer's path (model/attention.py,
``AttentionPath``); nothing is declared twice, as a method and as a flag. A scheme that writes one of the hooks
below without its interface is refused when its class is defined (model/pe/base.py), so a hook never goes unread.

Where position enters:

- :class:`PositionEmbedding`: a vector per position added to the token embeddings;
- :class:`Rotation`: q and k transformed in every layer; it may return two rotations merged by distance
  (``score_window``) or q and k wider than v;
- :class:`ScoreBias`: a term added to the scores from (query position, key position, head, layer), written once
  as an elementwise function; refined by :class:`DistanceBias` (a function of q_pos - k_pos alone),
  :class:`LayerwiseBias` (other values in every layer) and :class:`UncompiledScoreBias` (inductor cannot compile
  it into a FlexAttention score_mod);
- :class:`ContentBias`: a term computed from the scores themselves;
- :class:`CumulativeBias`: terms g_t from the layer's input whose cumulative sums c give c_i - c_j;
- :class:`AttentionWeights`: the weights that multiply the values in place of softmax;
- :class:`TransportedScores`: logits taken through one transition per token between query and key;
- :class:`SlidingWindow`: each query attends its W most recent keys alone (a local layer);

and one that is a faster way to the same numbers: :class:`FusedKernel`, an installed package's kernel for the
scheme's whole attention. The hooks' meaning in full is in model/pe/base.py's docstring.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
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


class ContentBias:
    """Adds a term computed from the scores themselves: no fused kernel takes it, so the written-out path runs."""

    def content_bias(self, q: torch.Tensor, scores: torch.Tensor, layer: int) -> torch.Tensor:
        """q (B, H, Tq, D) and the scaled, causally masked scores (B, H, Tq, Tk) -> a term added to them."""
        raise NotImplementedError


class CumulativeBias:
    """Adds c_i - c_j, c = cumsum(g), with the terms g computed per token from the layer's input (data, not
    positions): the layer computes c and attention adds it on any path."""

    def cumulative_bias(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """The input of ``layer``'s attention, (B, T, C) -> the terms g, (B, H, T)."""
        raise NotImplementedError


class AttentionWeights:
    """Weighs the values by its own rule in place of softmax, from the scaled, causally masked scores of a block of
    queries, each query's row on its own: the written-out path runs, and there is no denominator for a sink."""

    def attention_weights(self, scores: torch.Tensor, layer: int) -> torch.Tensor:
        """The scaled scores (B, H, Tq, Tk) with the scheme's biases and -inf where the causal mask hides a key -> the
        weights, same shape, float32 or wider, that multiply the values in place of softmax(scores)."""
        raise NotImplementedError


class TransportedScores:
    """Takes the logit of query i over key j through one transition per token between them, each computed from the
    layer's input: the written-out path runs, with these logits in place of q . k, one block of queries at a time."""

    # Tokens per chunk of the logits' products, which each block of queries computes its rows from (memory model).
    transition_chunk: ClassVar[int] = 0

    def transitions(self, x: torch.Tensor, layer: int) -> Any:
        """The input of ``layer``'s attention, (B, T, C) -> the transitions of its tokens, in whatever form
        ``transported_scores`` reads."""
        raise NotImplementedError

    def transported_scores(
        self, q: torch.Tensor, k: torch.Tensor, transitions: Any, carry: bool
    ) -> tuple[Callable[[int, int], torch.Tensor], torch.Tensor | None]:
        """The new queries q (B, H, Tq, D) and every key k (B, H, Tk, D), cached ones first (already carried), with the
        ``transitions`` of the Tq new tokens -> ``rows(start, stop)``, the logits of queries start..stop-1 over every
        key, (B, H, stop - start, Tk), unscaled and unmasked, float32 or wider; and with ``carry``, every key carried
        through the transitions of every token after it, (B, H, Tk, D), for the KV cache (None without)."""
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
    GPU), where one applies: attention runs it for full causal passes and the written-out path for anything it
    cannot take (a KV cache, captured probabilities, positions per token, a sink)."""

    # The attention backend the runs' records name it by, and (module, name) of the kernel in its package.
    fused_backend: ClassVar[str] = ""
    fused_kernel: ClassVar[tuple[str, str]] = ("", "")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # imported here, not in the forward pass that torch.compile traces; only where CUDA is (Triton needs it)
        self._kernel = installed_kernel(*self.fused_kernel) if torch.cuda.is_available() else None

    def fused_attention(self, device: torch.device) -> Callable[..., torch.Tensor] | None:
        """A kernel ``kernel(q, k, v, x, layer)`` -> the attention output (B, H, T, Dv) of a full causal pass of q, k,
        v (B, H, T, D) (q scaled by the model's attention temperature), with x (B, T, C) the layer's input, computing
        what the written-out path computes; None where no installed kernel applies on ``device``."""
        raise NotImplementedError


# Each interface's hooks: a scheme that writes one of them inherits the interface (model/pe/base.py checks it).
HOOKS: dict[str, type] = {
    "embed": PositionEmbedding,
    "rotate": Rotation,
    "score_window": Rotation,
    "rotation_depends_on_length": Rotation,
    "score_bias": ScoreBias,
    "bias_block": ScoreBias,
    "content_bias": ContentBias,
    "cumulative_bias": CumulativeBias,
    "attention_weights": AttentionWeights,
    "transitions": TransportedScores,
    "transported_scores": TransportedScores,
    "fused_attention": FusedKernel,
    "sliding_window": SlidingWindow,
}
