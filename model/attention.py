"""Causal self-attention kernels, one entry point for every positional scheme.

Which path a layer takes is chosen once, when the model is built: :func:`resolve_path` reads the interfaces its
scheme inherits (model/pe/capabilities.py), the backend asked for, the device's kind and whether the model has
sink logits, and returns an :class:`AttentionPath` (the kernel, whether a distance table stands in for the bias and
per layer or not, whether FlexAttention's score_mod reads it, the cumulative bias, content bias, own weights or
transported scores, a window of merged rotations, the scheme's fused kernel). The forward pass follows it and asks
the scheme nothing; it decides only what the pass itself brings (positions given per token, a KV cache, captured
probabilities) and what the process has learnt (FlexAttention or a fused kernel given up after a failure). The model
resolves the paths again when an evaluation-time variation changes a scheme's settings, and prints them.

    attend(q, k, v, pe, backend, state, layer) = softmax(q k^T / sqrt(d) + bias + causal mask) v

Backends (``model.attn_backend``):
- ``sdpa``: PyTorch's scaled_dot_product_attention. Without a score bias and without a KV cache it runs with
  ``is_causal=True`` and no mask, so the flash kernel is used on GPU (and the fused flash kernel on CPU); in
  float32 a cumulative bias alone is folded into q and k and takes that kernel too (``_folded_causal_sdpa``).
  With a bias (ALiBi, ...) it is given the bias as a float mask, materialised one block of queries at a
  time so memory stays at O(block x T) per head instead of O(T^2): this is the CPU path for bias schemes.
  Keys after a block's last query are left out, so the blocks skip most of the masked half as the causal
  kernel does. A bias that depends only on the distance (a ``DistanceBias``) is computed once per distance
  and each block is cut from that table (``_relative_block``).
- ``flex``: FlexAttention with the scheme's bias as a ``score_mod`` and a causal block mask; nothing is
  materialised (CUDA, compiled). A bias that depends only on the distance (a ``DistanceBias``), with positions
  0..T-1, is evaluated by the scheme's own code once per forward pass (per layer if it depends on the layer) into
  a table of (H, T) values, one per head and distance, the table the sdpa path cuts its blocks from
  (``_distance_bias``); the score_mod reads ``table[h, q_idx - kv_idx]``. That is one read of one tensor whatever
  the scheme computes (a bucket, a logarithm), so inductor compiles it, and FlexAttention's backward adds each
  score's gradient into the table, from which autograd carries it to the scheme's parameters. Any other bias
  (per-row positions, one that reads the query's position) runs ``score_bias`` inside the score_mod.
  ``kernel_options`` (``model.flex_kernel_options``: block sizes, stages, warps) go to FlexAttention's kernels as
  given; empty, its own defaults. On CPU, torch 2.13 runs FlexAttention forward only (eager and unfused, for
  checking), so training there with ``flex`` is refused with a clear error. The table's score_mod is checked there
  against the math path (forward through FlexAttention; gradients through the score_mod evaluated at every pair,
  tests/test_flex_distance_table.py); its speed and memory on a GPU, and which kernel options it wants there, are
  still to be measured (``bash bench/gpu_table.sh OUT --part 1``).
- ``math``: the plain formula, written out one block of queries at a time; the reference the tests compare every
  backend against. With gradients and more than one block, each block of at most ``_RECOMPUTED_BLOCK`` queries is
  recomputed in the backward pass (torch.utils.checkpoint): the forward keeps only its inputs and outputs, never
  the scores, gates or probabilities of a block, so training holds one block's (B, H, block, T) at a time instead
  of every layer's (B, H, T, T). On CPU, CoPE's attention at 1,024 tokens (B = H = 4, head size 64) peaked at 478
  MiB instead of 1,277 (docs/speed.md); on a GPU, CoPE at GPT-2 small is still to be measured (``--part 2``).
- ``auto``: flex for bias schemes on CUDA, sdpa otherwise. A scheme whose score_mod inductor cannot compile
  (an ``UncompiledScoreBias``, for a bias not read from a distance table) runs sdpa on CUDA, even when flex is
  asked for: with positions 0..T-1 every bias that depends only on the distance reads its table and takes flex.

If FlexAttention fails when it is first used (its compilation, say, on an unsupported GPU), the process
warns once and runs sdpa from then on; :func:`resolve_backend` then reports ``sdpa`` and ``flex_failure``
holds why.

With a KV cache (queries not starting at position 0) flex falls back to the blockwise sdpa path. A scheme
with a content bias (CoPE), or whose scores are merged from two rotations by distance (``Rotation.score_window``:
RoPE's remaps, model/windowed_attention.py), always runs ``math``, whatever the backend. The causal mask is
by index; the scheme's bias is by position (``PositionState``), so positions may be any increasing sequence per row.

A scheme whose weights replace softmax (``AttentionWeights``) always runs ``math`` too: each block of queries
gets its scaled, causally masked scores (-inf where hidden, as a content bias sees them), the scheme turns them into
weights, float32, and the output is those weights times v. Blocks of queries bound the memory as for softmax, and a KV
cache changes nothing but the block's first query index. With no softmax there is no denominator for a sink: refused.

A scheme whose logits carry each key to its query through per-token transitions (``TransportedScores``) always runs
``math`` too: the layer hands over those logits as a function of a block of queries (``logits(start, stop)``, (B, H,
stop - start, Tk), unscaled), which each block calls in place of q . k, so that no more rows than a block's exist at
once (and, training, are recomputed with it); the scale, biases, mask and softmax follow as for any scheme.

Either kind of scheme may bring a kernel of its own for the whole of its attention (``FusedKernel``, model/pe/base.py,
hook 8: an installed package's Triton kernel on CUDA). The layer runs it in place of ``attend`` for a full causal pass
(:func:`fused_attention`), on any backend but ``math``; a KV cache, captured probabilities, positions per token (packed
documents) or a sink run ``math``. :func:`resolve_backend` then reports the scheme's ``fused_backend`` (the runs'
records name the kernel), and a kernel that fails at its first use is given up as FlexAttention is (``fused_failure``).

A cumulative bias (``CumulativeBias``) comes as data, ``sums`` = c of every key, (B, H, Tk), computed
by the layer from its input: query i over key j gets c_i - c_j. It takes the same paths as a score bias: sdpa
folds it into q and k (float32, no cache: the fused causal kernel) or adds it to each materialised mask block,
flex reads it in the ``score_mod`` (score + c[b, h, q] - c[b, h, k]), math adds it to the written-out scores.

Documents packed into a row (``state.documents``, ``data.document_aware``; model/documents.py): every path keeps a
query within its document. The masks of ``math`` and sdpa's blocks get -inf across documents, so sdpa skips its
fused causal kernel (and the fold of a cumulative bias, and the CPU sink kernel) for the blockwise path; flex takes
a block mask whose mask_mod compares the documents.

``attend(..., capture=probs)`` runs ``math`` and appends the probabilities to the list ``probs`` (attention
diagnostics: ``GPT.forward(..., capture=probs)`` hands one list to every layer).

``attend(..., sink=s)`` adds a sink logit per head to every softmax's denominator (``model.attn_sink``), on every
path: model/sink.py says how each computes it.

A scheme's ``rotate`` may return q and k wider than v: two rotations side by side (RoPE's remaps, whose windowed
path scales scores by 1 / sqrt(size of v)), or one wider form of each head (PoPE: each coordinate a complex number,
2d real ones). Every other path scales scores by 1 / sqrt(size of q), so such a scheme folds the scale it wants
into q. The written-out path takes the sizes as they are; for the kernels (sdpa's fused causal kernel, the CPU
sink kernel, FlexAttention), which need one head size, v is padded with zeros to q's and the padding dropped from
the output.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from core.errors import PosGPTError, first_line, warn
from model.documents import document_block_mask, same_document
from model.pe.base import PositionalEncoding, PositionState
from model.pe.capabilities import (
    AttentionWeights,
    ContentBias,
    CumulativeBias,
    DistanceBias,
    FusedKernel,
    LayerwiseBias,
    Rotation,
    ScoreBias,
    SlidingWindow,
    TransportedScores,
    UncompiledScoreBias,
)
from model.sink import CpuFlashSink, sink_as_key, sink_rescale, with_sink_column
from model.windowed_attention import windowed_attention

BACKENDS = ("auto", "sdpa", "flex", "math")

# Upper bound on materialised scores (math path) or mask entries (sdpa path with a bias) per block of queries,
# in elements, all heads and batch rows together: 64 MiB in fp32.
_MAX_BLOCK_SCORES = 1 << 24

# Why FlexAttention was given up in this process (None while it works): from then on sdpa runs instead.
flex_failure: str | None = None
# Why a scheme's own kernel (model/pe/base.py, hook 8) was given up (None while it works): the written-out path runs.
fused_failure: str | None = None


@dataclass(frozen=True)
class AttentionPath:
    """One layer's attention, resolved from its scheme's interfaces (model/pe/capabilities.py), the backend asked
    for, the device kind and the model's sink when the model is built (:func:`resolve_path`); the forward pass follows
    it and asks the scheme nothing. What is left to the pass itself is what only it knows: positions given per token
    (``explicit``), a KV cache or captured probabilities (both run the written-out or the blockwise path), and whether
    FlexAttention or the scheme's kernel has failed in this process (``flex_failure``, ``fused_failure``)."""

    runs: str  # a full causal pass with positions 0..T-1: sdpa | flex | math | the scheme's fused_backend
    explicit_runs: str  # the same with positions given per token (no distance table stands in for the bias)
    score_bias: bool = False  # the scheme's score_bias is added (mask blocks, score_mod)
    distance_table: bool = False  # with positions 0..T-1 the bias is read from its table per distance
    table_per_layer: bool = False  # ... made once per layer, not once per forward pass
    table_in_score_mod: bool = False  # FlexAttention's score_mod reads the table (the bias itself does not compile)
    cumulative_bias: bool = False  # the layer computes c = cumsum(g) from its input
    content_bias: bool = False  # the written-out path adds the scheme's content bias
    own_weights: bool = False  # the written-out path takes the scheme's weights in place of softmax
    transported: bool = False  # the layer computes the scheme's transported logits in place of q . k
    window: int | None = None  # scores merged from two rotations by distance (model/windowed_attention.py)
    rotate_cached_keys: bool = False  # the rotation depends on the length: a KV cache keeps keys unrotated
    fused: str | None = None  # the scheme's kernel for a full causal pass (its fused_backend), where it runs
    sliding_window: int | None = None  # each query attends its W most recent keys alone (SlidingWindow)

    def backend(self, explicit: bool = False) -> str:
        """The backend a full pass runs, as the runs' records name it: sdpa for flex once FlexAttention has failed in
        this process, the written-out path for the scheme's kernel once it has."""
        runs = self.explicit_runs if explicit else self.runs
        if runs == "flex" and flex_failure is not None:
            return "sdpa"
        return "math" if runs == self.fused and fused_failure is not None else runs

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
            "cumulative bias": self.cumulative_bias,
            "content bias": self.content_bias,
            "own weights": self.own_weights,
            "transported scores": self.transported,
        }
        return ", ".join(parts + [name for name, used in extras.items() if used])


def resolve_path(pe: PositionalEncoding, backend: str, device: torch.device | str, sink: bool = False) -> AttentionPath:
    """The attention path of a layer that runs ``pe`` on a device of ``device``'s kind, asked for ``backend``, with
    sink logits or not (model.attn_sink): the only place that reads the scheme's interfaces."""
    if backend not in BACKENDS:
        raise PosGPTError(f"unknown model.attn_backend={backend!r}; choose one of {list(BACKENDS)}")
    device = torch.device(device)
    cuda = device.type == "cuda"
    window = pe.score_window() if isinstance(pe, Rotation) else None
    sliding = pe.sliding_window() if isinstance(pe, SlidingWindow) else None
    if sliding is not None and window is not None:
        raise PosGPTError(
            f"pe={pe.name}: a sliding window of {sliding} keys and scores merged from two rotations by distance "
            "do not go together; drop one"
        )
    biased = isinstance(pe, ScoreBias)
    traits = dict(
        score_bias=biased,
        distance_table=isinstance(pe, DistanceBias),
        table_per_layer=isinstance(pe, LayerwiseBias),
        table_in_score_mod=isinstance(pe, DistanceBias) and isinstance(pe, UncompiledScoreBias),
        cumulative_bias=isinstance(pe, CumulativeBias),
        content_bias=isinstance(pe, ContentBias),
        own_weights=isinstance(pe, AttentionWeights),
        transported=isinstance(pe, TransportedScores),
        window=window,
        rotate_cached_keys=isinstance(pe, Rotation) and pe.rotation_depends_on_length(),
        sliding_window=sliding,
    )
    if traits["content_bias"] or traits["own_weights"] or traits["transported"] or window is not None:
        # the bias needs the scores themselves, two scores per pair, weights that are not a softmax, or logits that are
        # not q . k: no PyTorch kernel; the scheme's own, where one is installed, for what it can take
        own = isinstance(pe, FusedKernel) and backend != "math" and not sink and sliding is None
        own = own and pe.fused_attention(device) is not None
        runs = pe.fused_backend if own else "math"
        return AttentionPath(runs, "math", fused=pe.fused_backend if own else None, **traits)
    if backend == "auto":  # FlexAttention's block mask skips the blocks outside a sliding window
        backend = "flex" if (biased or traits["cumulative_bias"] or sliding is not None) and cuda else "sdpa"
    explicit_runs = backend
    if backend == "flex" and cuda and isinstance(pe, UncompiledScoreBias):
        # its score_mod cannot be compiled (CPU runs FlexAttention eagerly: it can there); a distance table, read
        # with positions 0..T-1, compiles
        explicit_runs = "sdpa"
        backend = "flex" if traits["distance_table"] else "sdpa"
    return AttentionPath(backend, explicit_runs, **traits)


def resolve_backend(
    backend: str, pe: PositionalEncoding, device: torch.device, explicit: bool = False, sink: bool = False
) -> str:
    """The backend that will actually run for this scheme on this device (sdpa for flex once FlexAttention
    has failed in this process, see ``flex_failure``); ``explicit``: positions are given per token (training's
    random positions, documents), not 0..T-1, so no distance table stands in for the scheme's score_bias; ``sink``:
    the model has sink logits (model.attn_sink)."""
    return resolve_path(pe, backend, device, sink).backend(explicit)


def resolve_layer_backends(
    backend: str, pe: PositionalEncoding, device: torch.device, explicit: bool = False, sink: bool = False
) -> str:
    """:func:`resolve_backend` of the scheme each layer runs (``PositionalEncoding.layer_schemes``): one backend,
    or the distinct ones in layer order joined by ``+`` when layers differ (a per-layer pattern with a bias scheme
    in some layers, on CUDA: ``sdpa+flex``)."""
    schemes = pe.layer_schemes()
    return "+".join(dict.fromkeys(resolve_backend(backend, scheme, device, explicit, sink) for scheme, _ in schemes))


def fused_attention(
    pe: PositionalEncoding, path: AttentionPath, state: PositionState
) -> Callable[..., torch.Tensor] | None:
    """The scheme's own kernel for a layer's whole attention (:class:`FusedKernel`), where the layer's ``path`` runs it
    and the pass is a full causal one at positions 0..T-1 (no KV cache, no captured probabilities: the caller's to
    check), wrapped so that a kernel failing at its first use (a Triton compilation, say) is given up as FlexAttention
    is: warned once, ``fused_failure`` set, the written-out path from then on; None otherwise."""
    if path.fused is None or state.q_offset != 0 or path.backend(state.explicit) != path.fused:
        return None
    own = pe.fused_attention(state.positions.device)
    if own is None:
        return None

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x: torch.Tensor, layer: int) -> torch.Tensor | None:
        if torch.compiler.is_compiling():  # traced into the enclosing compilation, which falls back as a whole
            return own(q, k, v, x, layer)
        try:
            return own(q, k, v, x, layer)
        except torch.OutOfMemoryError:
            raise  # the written-out path needs more memory, not less
        except Exception as error:  # whatever the kernel's compilation raises (triton, a driver)
            _give_up_fused(error, path.fused)
            return None

    return run


def _give_up_fused(error: Exception, name: str) -> None:
    global fused_failure
    fused_failure = first_line(error)
    warn(f"{name} attention failed ({fused_failure}); the written-out path runs from now on")


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


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pe: PositionalEncoding,
    backend: str,
    state: PositionState | None = None,
    layer: int = 0,
    capture: list[torch.Tensor] | None = None,
    sums: torch.Tensor | None = None,
    sink: torch.Tensor | None = None,
    kernel_options: dict | None = None,
    logits: Callable[[int, int], torch.Tensor] | None = None,
    path: AttentionPath | None = None,
) -> torch.Tensor:
    """q: (B, H, Tq, D), the last Tq of the keys; k, v: (B, H, Tk, D). ``state`` holds the positions (default:
    keys at 0 .. Tk-1); ``layer`` selects the scheme's per-layer parameters. With a ``capture`` list, the math
    path runs and its probabilities, float32 (B, H, Tq, Tk), are appended to it. ``sums``: the cumulative bias's
    c of every key, (B, H, Tk) float32, or None. ``sink``: (H,) sink logits, or None. ``kernel_options``:
    FlexAttention's, for its kernels (None or empty: its defaults). ``logits``: the scheme's transported logits in
    place of q . k, as ``logits(start, stop)`` -> those of queries start..stop-1 over k, (B, H, stop - start, Tk); or
    None. ``path``: the layer's, resolved when the model was built (None: resolved here from ``backend``)."""
    if state is None:
        state = default_state(pe, q.shape[-2], k.shape[-2], q.device)
    if path is None:
        path = resolve_path(pe, backend, q.device, sink is not None)
    if capture is not None:
        out, probs = _math_attention(q, k, v, pe, path, state, layer, sums, sink, keep_probs=True, logits=logits)
        capture.append(probs)
        return out
    backend = path.backend(state.explicit)
    if backend in ("math", path.fused):  # the scheme's own kernel runs from the layer (fused_attention)
        return _math_attention(q, k, v, pe, path, state, layer, sums, sink, logits=logits)[0]
    width = v.shape[-1]
    options = kernel_options or None
    if q.shape[-1] != width:
        # q and k wider than v (a scheme's rotate may widen them, model/pe/base.py): PyTorch's fused kernels take one
        # head size for q, k and v, so v gets zeros up to q's size, and the output drops them.
        v = F.pad(v, (0, q.shape[-1] - width))
        return _kernel_attention(q, k, v, pe, path, backend, state, layer, sums, sink, options)[..., :width]
    return _kernel_attention(q, k, v, pe, path, backend, state, layer, sums, sink, options)


def _kernel_attention(q, k, v, pe, path, backend, state, layer, sums, sink, kernel_options=None):
    """:func:`attend` on the flex or sdpa backend (``backend`` resolved), q, k and v of one head size."""
    full = state.q_offset == 0 and q.shape[-2] == k.shape[-2]
    if backend == "flex" and full:
        if q.device.type == "cpu" and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise PosGPTError(
                "model.attn_backend=flex cannot train on CPU: FlexAttention has no CPU backward in this "
                "PyTorch. Use model.attn_backend=auto (or sdpa) on CPU."
            )
        if torch.compiler.is_compiling():
            # Traced into the enclosing compilation, which fails as a whole: training.step falls back to eager.
            return _flex_attention(q, k, v, pe, path, state, layer, sums, sink, kernel_options)
        try:
            return _flex_attention(q, k, v, pe, path, state, layer, sums, sink, kernel_options)
        except torch.OutOfMemoryError:
            raise  # the sdpa path needs more memory, not less
        except Exception as error:  # whatever its compilation raises (inductor, triton, a driver)
            _give_up_flex(error)
    if not path.score_bias and full and state.documents is None and path.sliding_window is None:  # masks needed
        if sums is None and sink is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if sums is None:  # a sink (model/sink.py)
            if q.device.type == "cpu":
                return CpuFlashSink.apply(q, k, v, sink)
            q1, k1, v1 = sink_as_key(q, k, v, sink, dummy_query=True)
            return F.scaled_dot_product_attention(q1, k1, v1, is_causal=True, scale=q.shape[-1] ** -0.5)[:, :, 1:]
        if q.dtype == torch.float32 and sink is None:
            return _folded_causal_sdpa(q, k, v, sums)
    return _blockwise_sdpa(q, k, v, pe, path, state, layer, sums, sink)


def _folded_causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sums: torch.Tensor) -> torch.Tensor:
    """Causal attention with the cumulative bias c_i - c_j folded into two more dimensions of q and k,

        q' = [q, c sqrt(d), sqrt(d)],  k' = [k, 1, -c],  v' = [v, 0, 0]
        =>  q'_i . k'_j / sqrt(d) = q_i . k_j / sqrt(d) + c_i - c_j

    so the fused causal kernel runs with no mask (on CPU a mask that needs a gradient sends SDPA to its unfused
    math kernel: 5.8x slower at 1,024 tokens, measured). float32 only: the dot product adds c_i and -c_j, so
    its rounding grows with |c|; c is first centred on the middle token (the bias is unchanged), which keeps
    the error within 1.3x the mask path's against float64 (4.3e-5 vs 3.8e-5 at 4,096 tokens, c down to -766),
    while in bfloat16 it would be far too coarse (the mask path runs there)."""
    d = q.shape[-1]
    root = math.sqrt(d)
    middle = sums.shape[-1] // 2
    c = (sums - sums[..., middle : middle + 1])[..., None].to(q.dtype)
    one, zero = torch.ones_like(c), torch.zeros_like(c)
    q = torch.cat((q, c * root, one * root), dim=-1)
    k = torch.cat((k, one, -c), dim=-1)
    v = torch.cat((v, zero, zero), dim=-1)  # the same head size as q and k: the kernel's fused path needs it
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / root)[..., :d]


def check_kernel_options(options: Mapping[str, Any]) -> None:
    """PosGPTError unless each key of ``options`` (``model.flex_kernel_options``) is one of FlexAttention's kernel
    options (torch's ``FlexKernelOptions``), bare or for one pass only (``fwd_``, ``bwd_``), with a number, a boolean
    or a word for its value. Whether a value fits the GPU (its shared memory, the block mask's blocks) only its
    compilation can tell: if it does not, the run warns and takes sdpa (``flex_failure``)."""
    try:
        from torch.nn.attention.flex_attention import FlexKernelOptions
    except ImportError:  # an older torch: its kernels check them
        return
    known = FlexKernelOptions.__required_keys__ | FlexKernelOptions.__optional_keys__
    for key, value in options.items():
        if str(key).removeprefix("fwd_").removeprefix("bwd_") not in known:
            raise PosGPTError(
                f"model.flex_kernel_options: {key!r} is not one of FlexAttention's FlexKernelOptions "
                f"({', '.join(sorted(known))}; fwd_ or bwd_ in front for one pass only)"
            )
        if not isinstance(value, (bool, int, str)):
            raise PosGPTError(f"model.flex_kernel_options.{key} must be a number, true/false or a word (got {value!r})")


def _give_up_flex(error: Exception) -> None:
    global flex_failure
    flex_failure = first_line(error)
    warn(f"FlexAttention failed ({flex_failure}); attention runs sdpa (bias as a blockwise mask) from now on")


def _bias_and_mask(
    pe: PositionalEncoding,
    path: AttentionPath,
    state: PositionState,
    start: int,
    stop: int,
    k_stop: int,
    layer: int,
    dtype: torch.dtype,
    sums: torch.Tensor | None = None,
) -> torch.Tensor:
    """Additive mask for queries start..stop-1 over keys 0..k_stop-1: the scheme's bias where key <= query,
    -inf elsewhere; (H, Tq, Tk), (B, H, Tq, Tk) with per-row positions or a cumulative bias, or (1, Tq, Tk)
    without a bias."""
    mask = _score_bias_and_mask(pe, path, state, start, stop, k_stop, layer, dtype)
    if state.documents is not None:  # -inf across documents too (model/documents.py): (B, H or 1, Tq, Tk)
        queries = slice(state.q_offset + start, state.q_offset + stop)
        same = same_document(state.documents, queries, slice(0, k_stop))[:, None]
        mask = torch.where(same, mask, float("-inf"))
    if path.sliding_window is not None:  # -inf before the window too: key j <= i - W
        mask = mask.masked_fill(_before_window(state, start, stop, k_stop, path.sliding_window), float("-inf"))
    if sums is None:
        return mask
    # c_i - c_j in float32 (c grows along the sequence), then in the scores' dtype; -inf stays -inf.
    query_sums = sums[..., state.q_offset + start : state.q_offset + stop, None]
    return mask + (query_sums - sums[..., None, :k_stop]).to(dtype)


def _before_window(state: PositionState, start: int, stop: int, k_stop: int, window: int) -> torch.Tensor:
    """(Tq, Tk) bool: whether key j (0..k_stop-1) lies before the sliding window of query i (index q_offset + start
    .. q_offset + stop - 1 among the keys), j <= i - W."""
    device = state.positions.device
    query_index = torch.arange(state.q_offset + start, state.q_offset + stop, device=device)
    return torch.arange(k_stop, device=device)[None, :] <= query_index[:, None] - window


def _score_bias_and_mask(
    pe: PositionalEncoding,
    path: AttentionPath,
    state: PositionState,
    start: int,
    stop: int,
    k_stop: int,
    layer: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """:func:`_bias_and_mask` without the cumulative bias."""
    if path.distance_table and not state.explicit:
        return _relative_block(pe, path, state, start, stop, k_stop, layer, dtype)
    device = state.positions.device
    query_index = torch.arange(state.q_offset + start, state.q_offset + stop, device=device)
    causal = torch.arange(k_stop, device=device)[None, :] <= query_index[:, None]
    if path.score_bias:
        bias = pe.bias_block(state.positions[..., start:stop], state.key_positions[..., :k_stop], layer).to(dtype)
    else:
        bias = torch.zeros((1,) + causal.shape, dtype=dtype, device=device)
    return bias.masked_fill(~causal, float("-inf"))


def _relative_block(
    pe: PositionalEncoding,
    path: AttentionPath,
    state: PositionState,
    start: int,
    stop: int,
    k_stop: int,
    layer: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The mask of :func:`_bias_and_mask` for a scheme whose bias depends only on the distance d = query -
    key (a ``DistanceBias``), cut from its table per distance (:func:`_distance_bias`).

    Reversed and padded, the table holds, per head, the bias at d = Tk-1, Tk-2, ..., 0 followed by Tk-1 entries of
    -inf (d < 0): query a's row over keys 0..k-1 is the window starting at Tk-1-a, so a block of queries is a window
    view of it, read backwards (one copy). The scheme's function is evaluated Tk times, not Tq x Tk; the padded
    copy, (H, 2 Tk - 1), is made per block, so nothing but the table is cached (a block recomputed in the backward
    pass, ``_math_attention``, must find the same cache as its first run)."""
    n_keys = state.seq_len
    bias = _distance_bias(pe, path, state, layer).flip(-1).to(dtype)  # (H, Tk): d = Tk-1 .. 0
    table = torch.cat((bias, bias.new_full((bias.shape[0], n_keys - 1), float("-inf"))), dim=-1)
    first, last = state.q_offset + start, state.q_offset + stop  # absolute indices of the block's queries
    windows = table.unfold(-1, k_stop, 1)  # (H, 2Tk-k_stop, k_stop): window s = entries s .. s+k_stop-1
    return windows[:, n_keys - last : n_keys - first].flip(-2)


def _distance_bias(pe: PositionalEncoding, path: AttentionPath, state: PositionState, layer: int) -> torch.Tensor:
    """(H, Tk): the bias of a scheme whose bias depends only on the distance (a ``DistanceBias``) at distances
    d = 0 .. Tk-1, evaluated by the scheme's own ``bias_block`` once per forward pass, or once per layer when it
    depends on the layer, and kept in ``state.bias_blocks``. It keeps its autograd graph: gradients of the scores
    that read it reach the scheme's parameters through it (sdpa's mask blocks are cut from it, FlexAttention's
    score_mod reads it)."""
    key = ("distance", layer if path.table_per_layer else None)
    table = state.bias_blocks.get(key)
    if table is None:
        distances = torch.arange(state.seq_len, device=state.positions.device)
        table = state.bias_blocks[key] = pe.bias_block(distances, distances[:1], layer)[..., 0]
    return table


def _query_block(q: torch.Tensor, k: torch.Tensor) -> int:
    """Queries per block, so that a block's scores stay within _MAX_BLOCK_SCORES elements."""
    B, H, Tq, _ = q.shape
    return max(1, min(Tq, _MAX_BLOCK_SCORES // max(1, B * H * k.shape[-2])))


# Queries per block of the written-out path while it keeps gradients (fewer where _MAX_BLOCK_SCORES asks), when the
# queries make more than one block: each block is computed without keeping anything for backward and computed again in
# the backward pass (torch.utils.checkpoint), so its scores, gates and probabilities, (B, H, block, Tk) each, exist for
# one block at a time, forward and backward: O(block x Tk) per head, not the O(Tq x Tk) of every block of every layer
# kept until the backward pass. The price is the forward computation once more: on CPU, attention alone, forward and
# backward, 1.2x the time for one block of 64 queries recomputed (so a single block is kept instead), 0.56x at 1,024
# tokens, whose blocks of 128 stay in cache where whole (T, T) tensors do not (docs/speed.md). FlexAttention's block
# size, FLEX_BLOCK.
_RECOMPUTED_BLOCK = 128


def _math_attention(q, k, v, pe, path, state, layer, sums=None, sink=None, keep_probs=False, logits=None):
    """softmax(q k^T / sqrt(d) + bias + mask (+ content bias)) v, written out, one block of queries at a time
    (rows are independent; blocks bound the memory of long sequences, and with gradients each block is recomputed in
    the backward pass: ``_RECOMPUTED_BLOCK``); with a sink, softmax([sink, scores])
    without the sink's column; the scheme's own weights in place of softmax where it has them. Returns (output,
    probabilities or None). ``logits``: the scheme's in place of q . k (see :func:`attend`)."""
    if path.window is not None:  # two rotations merged by distance (model/pe/base.py)
        if sink is not None:
            raise PosGPTError(
                "model.attn_sink: the written-out attention that merges two rotations by distance has no sink "
                "logit; evaluate this run without that variation"
            )
        return windowed_attention(q, k, v, state, path.window, keep_probs)
    if path.own_weights and sink is not None:
        raise PosGPTError(
            f"model.attn_sink: pe={pe.name} weighs the values by its own rule, not a softmax, so there is no "
            "denominator for a sink logit; train without model.attn_sink"
        )
    Tq = q.shape[-2]
    block = _query_block(q, k)
    grad = not keep_probs and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    recompute = grad and Tq > min(block, _RECOMPUTED_BLOCK)  # a single block is kept: recomputing it costs only time
    if recompute:
        block = min(block, _RECOMPUTED_BLOCK)
        if path.distance_table and not state.explicit:
            _distance_bias(pe, path, state, layer)  # made once, outside the recomputed blocks, which then all read it
    outputs, probabilities = [], []
    for start in range(0, Tq, block):
        args = (q, k, v, pe, path, state, layer, start, min(Tq, start + block), sums, sink, logits)
        out, probs = checkpoint(_math_block, *args, use_reentrant=False) if recompute else _math_block(*args)
        outputs.append(out)
        if keep_probs:
            probabilities.append(probs.detach())
    return torch.cat(outputs, dim=2), (torch.cat(probabilities, dim=2) if keep_probs else None)


def _math_block(q, k, v, pe, path, state, layer, start, stop, sums, sink, logits=None):
    """The written-out attention of queries start..stop-1 over every key: (output, probabilities). A pure
    function of its arguments (it may read the per-forward tables of ``state``, never add to them), so that
    ``_math_attention`` can run it again in the backward pass."""
    q_block = q[:, :, start:stop]
    products = q_block @ k.transpose(-2, -1) if logits is None else logits(start, stop)
    scores = products / math.sqrt(q.shape[-1])
    scores = scores + _bias_and_mask(pe, path, state, start, stop, k.shape[-2], layer, scores.dtype, sums)
    if path.content_bias:
        scores = scores + pe.content_bias(q_block, scores, layer)
    if path.own_weights:
        probs = pe.attention_weights(scores, layer)
    elif sink is None:
        probs = torch.softmax(scores.float(), dim=-1)
    else:
        probs = torch.softmax(with_sink_column(scores, sink).float(), dim=-1)[..., 1:]
    return probs.to(q.dtype) @ v, probs


def _blockwise_sdpa(q, k, v, pe, path, state, layer, sums=None, sink=None):
    Tq, Tk = q.shape[-2], k.shape[-2]
    block = _query_block(q, k)
    outputs = []
    # The sink key goes first (model/sink.py), and the scale stays the original head size's.
    shift, scale = (0, {}) if sink is None else (1, {"scale": q.shape[-1] ** -0.5})
    if sink is not None:
        q, k, v = sink_as_key(q, k, v, sink, dummy_query=False)
    for start in range(0, Tq, block):
        stop = min(Tq, start + block)
        # Keys after the last query of the block are masked anyway: slice them off to save work.
        k_stop = min(Tk, state.q_offset + stop)
        mask = _bias_and_mask(pe, path, state, start, stop, k_stop, layer, q.dtype, sums)
        # Keys before the first query's window are masked too: left out as well (the sink key, first, is kept).
        k_start = 0 if path.sliding_window is None or sink is not None else _window_start(path, state, start)
        mask = mask[..., k_start:]
        if sink is not None:
            mask = torch.cat((mask.new_zeros(*mask.shape[:-1], 1), mask), dim=-1)
        if q.device.type == "cpu":
            # PyTorch's CPU flash kernel takes a slow path for a mask broadcast over the batch (3x slower at
            # 4096 tokens, measured): give it one mask per row. The block size bounds the copy.
            mask = mask.expand(q.shape[0], q.shape[1], -1, -1).contiguous()
        keys = slice(k_start, k_stop + shift)
        queries = q[:, :, start:stop]
        outputs.append(F.scaled_dot_product_attention(queries, k[:, :, keys], v[:, :, keys], attn_mask=mask, **scale))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)


def _window_start(path: AttentionPath, state: PositionState, start: int) -> int:
    """The first key that query ``start`` of a block (index q_offset + start among the keys) sees in its window."""
    return max(0, state.q_offset + start - path.sliding_window + 1)


# Kernels the compiled flex_attention may compile in one process (dynamo's default for a function is 8).
FLEX_RECOMPILE_LIMIT = 32


@functools.cache
def _compiled_flex_attention(backend: str | Callable = "inductor"):
    """flex_attention compiled once for the process (``backend``: torch.compile's; tests pick a lighter one). Its
    shapes change (a task trains on several lengths, evaluation scores every length and batch size): after the first
    change dynamo compiles a kernel generic in that size (automatic dynamic shapes), so a run compiles a few kernels,
    not one per shape: sizes of 1 (a batch of one row, a sequence of one block) are kernels of their own, and
    gradients or none double them, so the limit is ``FLEX_RECOMPILE_LIMIT`` here. Past it dynamo would run
    flex_attention unfused without a word (every score written out: slow, and T x T memory per head); here that
    raises instead, and :func:`attend` gives FlexAttention up, warned and recorded (``flex_failure``)."""
    from torch.nn.attention.flex_attention import flex_attention

    compiled = torch.compile(flex_attention, backend=backend)
    config = torch._dynamo.config
    # the second names: before torch 2.6
    fail_at_limit = next(n for n in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit") if hasattr(config, n))
    limit = next(n for n in ("recompile_limit", "cache_size_limit") if hasattr(config, n))

    def run(*args, **kwargs):
        with config.patch({fail_at_limit: True, limit: FLEX_RECOMPILE_LIMIT}):
            return compiled(*args, **kwargs)

    return run


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


@functools.cache  # one function per window: a compiled kernel that captured it is reused
def sliding_window_mask(window: int) -> Callable:
    """The causal mask_mod of a sliding window of ``window`` keys: key j visible to query i where i - W < j <= i."""

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)

    return mask_mod


def _mask_mod(window: int | None) -> Callable:
    return _causal if window is None else sliding_window_mask(window)


def _causal_block_mask(seq_len: int, device: str, window: int | None = None):
    """The causal BlockMask (within a sliding window of ``window`` keys, if not None): cached in eager mode; under
    torch.compile create_block_mask is traced into the graph instead, as dynamo would ignore the cache anyway (with a
    warning)."""
    if torch.compiler.is_compiling():
        return _dense_causal_block_mask(seq_len, device, window)
    return _cached_causal_block_mask(seq_len, device, window)


def _dense_causal_block_mask(seq_len: int, device: str, window: int | None = None):
    """create_block_mask's causal BlockMask, which evaluates the mask at every (query, key) pair first."""
    from torch.nn.attention.flex_attention import create_block_mask

    mask_mod = _mask_mod(window)
    return create_block_mask(mask_mod, B=None, H=None, Q_LEN=seq_len, KV_LEN=seq_len, device=device)


FLEX_BLOCK = 128  # FlexAttention's default block size, in tokens


def _make_causal_block_mask(seq_len: int, device: str, window: int | None = None):
    """The causal BlockMask built from its block structure: a query block sees the key blocks before it whole and
    its diagonal block in part; a last block cut short by seq_len is partial throughout (its padded rows are
    masked), as create_block_mask makes it. create_block_mask would first evaluate the mask at every (query, key)
    pair: a dense seq_len x seq_len tensor and its reductions, 2.6 GB at 16K tokens (measured on CPU, torch 2.13),
    most of what scoring 16K tokens on FlexAttention took (3.3 GB for a bias scheme, against 0.88 for RoPE on
    SDPA). This needs (seq_len / 128)^2 entries. tests/test_flex_all_schemes.py checks it equals create_block_mask's
    field by field.

    Within a sliding window of W keys, a pair of blocks holds the distances i - j from (a - b) B - (B - 1) to
    (a - b) B + (B - 1), for query block a and key block b of B tokens: the key block is seen whole where all of them
    lie in [0, W), in part where some do, and skipped otherwise."""
    from torch.nn.attention.flex_attention import BlockMask

    if "seq_lengths" not in inspect.signature(BlockMask.from_kv_blocks).parameters:  # torch < 2.6
        return _dense_causal_block_mask(seq_len, device, window)
    n = -(-seq_len // FLEX_BLOCK)
    q_block, kv_block = torch.arange(n, device=device).view(n, 1), torch.arange(n, device=device).view(1, n)
    nearest = (q_block - kv_block) * FLEX_BLOCK - (FLEX_BLOCK - 1)  # the least distance i - j in the pair of blocks
    farthest = nearest + 2 * (FLEX_BLOCK - 1)
    limit = seq_len if window is None else window
    full = (nearest >= 0) & (farthest < limit)
    partial = (farthest >= 0) & (nearest < limit) & ~full
    if seq_len % FLEX_BLOCK:
        partial[-1], full[-1] = partial[-1] | full[-1], False
    return BlockMask.from_kv_blocks(
        *_ordered_blocks(partial),
        *_ordered_blocks(full),
        FLEX_BLOCK,
        _mask_mod(window),
        seq_lengths=(seq_len, seq_len),
    )


def _ordered_blocks(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A BlockMask's (count, indices) of a (query block, key block) boolean matrix, broadcast over batch and heads:
    each row's key blocks first, in order, then the others (as create_block_mask orders them)."""
    count = blocks.sum(-1, dtype=torch.int32)
    indices = torch.argsort(blocks.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return count[None, None], indices[None, None]


_cached_causal_block_mask = functools.lru_cache(maxsize=32)(_make_causal_block_mask)


def _score_mod(
    pe: PositionalEncoding, path: AttentionPath, state: PositionState, layer: int, sums: torch.Tensor | None
):
    """The scheme's biases as a FlexAttention score_mod (None without any): the score bias, then the cumulative
    bias c[b, h, q] - c[b, h, k] (queries are keys here: no cache)."""
    score_mod = _score_bias_mod(pe, path, state, layer) if path.score_bias else None
    if sums is None:
        return score_mod

    # Read through two tensors: FlexAttention's backward cannot index one tensor that needs a gradient twice
    # (inductor refuses to lower it, seen on an H200 with torch 2.11); autograd adds the clone's gradient back.
    key_sums = sums.clone()

    def with_sums(score, b, h, q_idx, kv_idx):
        if score_mod is not None:
            score = score_mod(score, b, h, q_idx, kv_idx)
        return score + (sums[b, h, q_idx] - key_sums[b, h, kv_idx])

    return with_sums


def _score_bias_mod(pe: PositionalEncoding, path: AttentionPath, state: PositionState, layer: int):
    """The scheme's score bias as a FlexAttention score_mod. It reads the scheme's parameters, its distance table
    and the position tensors through the closure: FlexAttention lifts such captured tensors into inputs of its
    kernel, so gradients reach learnable bias parameters (and the cumulative bias's sums)."""
    if path.table_in_score_mod and not state.explicit:
        # A gather in the kernel costs shared memory: on an H200 (torch 2.11, head size 64) ALiBi's score_mod ran,
        # compiled, at 1.11x compiled RoPE, and the same bias read from this table did not fit FlexAttention's
        # forward kernel; so the table stands in only for a score_mod that does not compile.
        table = _distance_bias(pe, path, state, layer)  # (H, T): queries and keys are the same T tokens here

        def score_mod(score, b, h, q_idx, kv_idx):
            # The clamp keeps the index inside the table where the causal mask hides the score anyway (a key after
            # the query) and where the kernel pads a block past the sequence's end. The table's size is read here,
            # not captured as a number: a captured int is a constant to dynamo, one compilation per length.
            return score + table[h, (q_idx - kv_idx).clamp(0, table.shape[-1] - 1)]
    elif not state.explicit:

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + pe.score_bias(q_idx, kv_idx, h, layer)
    elif state.positions.dim() == 1:
        positions = state.positions

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + pe.score_bias(positions[q_idx], positions[kv_idx], h, layer)
    else:
        positions = state.positions

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + pe.score_bias(positions[b, q_idx], positions[b, kv_idx], h, layer)

    return score_mod


def _flex_attention(q, k, v, pe, path, state, layer, sums=None, sink=None, kernel_options=None):
    score_mod = _score_mod(pe, path, state, layer, sums)
    options = {} if kernel_options is None else {"kernel_options": dict(kernel_options)}
    window = path.sliding_window
    if state.documents is None:
        block_mask = _causal_block_mask(q.shape[-2], str(q.device), window)
    else:  # one per forward pass, shared by the layers of one window
        block_mask = state.bias_blocks.get(("documents", window))
        if block_mask is None:
            block_mask = state.bias_blocks[("documents", window)] = document_block_mask(state.documents, window)
    if sink is None:
        return _flex_kernel(q.device)(q, k, v, score_mod=score_mod, block_mask=block_mask, **options)
    from torch.nn.attention.flex_attention import AuxRequest

    flex = _flex_kernel(q.device)
    out, aux = flex(q, k, v, score_mod=score_mod, block_mask=block_mask, return_aux=AuxRequest(lse=True), **options)
    return sink_rescale(out, aux.lse, sink)


def _flex_kernel(device: torch.device):
    """Compiled flex_attention on CUDA (the fused kernel). Inside an enclosing torch.compile (the training
    model) the plain function, which the outer compilation fuses; on CPU too (forward only, unfused)."""
    from torch.nn.attention.flex_attention import flex_attention

    if device.type == "cuda" and not torch.compiler.is_compiling():
        return _compiled_flex_attention()
    return flex_attention
