"""The attention kernels, one registry of one signature, and the kernel each layer runs, chosen when the model is built.

    kernel(q, k, v, call) -> out        q: (B, H, Tq, D), the last Tq of the keys; k, v: (B, H, Tk, D);
                                        call: model/attention.py's AttentionCall (positions, layer, sink, mods)

``KERNELS`` (``model.attn_backend`` names one, or ``auto``; a scheme's own kernel, model/pe/capabilities.py's
``FusedKernel``, has the same signature):

- ``math``: the written-out formula, model/attention.py; the reference the tests compare every kernel against.
- ``sdpa``: PyTorch's scaled_dot_product_attention. Without a bias or a mask beyond the causal one, and without a KV
  cache, it runs with ``is_causal=True`` (the flash kernel); a term per pair may fold itself into q and k for it
  (``PairTerm.folded``). Otherwise it takes the bias and mask as a float mask, materialised one block of queries at a
  time (O(block x T) per head), without the keys after the block's last query or before its sliding window.
- ``flex``: FlexAttention, the bias as a ``score_mod`` and a block mask for the causal mask, the documents or a
  sliding window; nothing is materialised (CUDA, compiled). A ``DistanceBias`` that inductor cannot compile
  (``UncompiledScoreBias``) is read from its table per distance instead. ``kernel_options``
  (``model.flex_kernel_options``) go to FlexAttention as given. On CPU FlexAttention runs forward only: training there
  with ``flex`` is refused. With a KV cache flex runs sdpa.
- ``auto``: flex for a layer with a bias, a pair term or a sliding window on CUDA, sdpa otherwise.

A layer whose scheme changes attention in a way only the written-out path takes (a score modification that sees the
scores, logits in place of q . k, weights in place of softmax, scores merged from two rotations) runs ``math``, or the
scheme's own kernel for full causal passes where one is installed. Captured probabilities run ``math``.

Fallback. A kernel that may fail at its first use on a machine (FlexAttention's compilation, a scheme's Triton
kernel) is given a :class:`~model.fallback.Fallback` when the model is built, one per model and kernel: the first
failure is warned once and recorded there, and every layer that runs that kernel runs its fallback (sdpa, the
written-out path) from then on; ``LayerKernel.backend`` then names what runs, for the runs' records.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from core.errors import PosGPTError
from model.attention import (
    AttentionCall,
    AttentionPath,
    bias_and_mask,
    default_state,
    distance_bias,
    query_block,
    written_out_attention,
)
from model.documents import document_block_mask
from model.fallback import Fallback
from model.pe.base import PositionalEncoding, PositionState
from model.pe.capabilities import (
    WRITTEN_OUT_MODS,
    DistanceBias,
    FusedKernel,
    LayerwiseBias,
    ModifiesAttention,
    Rotation,
    ScoreBias,
    SlidingWindow,
    UncompiledScoreBias,
)
from model.sink import CpuFlashSink, sink_as_key, sink_rescale

Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, AttentionCall], torch.Tensor]


def math_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall) -> torch.Tensor:
    """The written-out attention (model/attention.py)."""
    return written_out_attention(q, k, v, call)[0]


def sdpa_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall) -> torch.Tensor:
    """scaled_dot_product_attention: the causal kernel where no mask but the causal one is needed, else blockwise."""
    return _padded(_sdpa, q, k, v, call)


def flex_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall) -> torch.Tensor:
    """FlexAttention over a full causal pass (queries are the keys)."""
    if q.device.type == "cpu" and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise PosGPTError(
            "model.attn_backend=flex cannot train on CPU: FlexAttention has no CPU backward in this "
            "PyTorch. Use model.attn_backend=auto (or sdpa) on CPU."
        )
    return _padded(_flex_attention, q, k, v, call)


KERNELS: dict[str, Kernel] = {"sdpa": sdpa_kernel, "flex": flex_kernel, "math": math_kernel}
BACKENDS = ("auto", *KERNELS)


class LayerKernel:
    """One layer's attention on one kind of device: its resolved ``path``, the scheme's own kernel where it runs with
    the dtypes of q, k and v it takes (``own_dtypes``), and the model's :class:`Fallback` of the kernel that may fail
    (None: none may)."""

    def __init__(
        self,
        path: AttentionPath,
        own: Kernel | None = None,
        fallback: Fallback | None = None,
        own_dtypes: frozenset[torch.dtype] = frozenset(),
    ) -> None:
        self.path, self.own, self.fallback, self.own_dtypes = path, own, fallback, own_dtypes

    def backend(self, explicit: bool = False, dtype: torch.dtype = torch.float32) -> str:
        """The kernel a full pass runs now with q, k and v in ``dtype`` (a run's autocast dtype; float32 without), as
        the runs' records name it: sdpa for flex and the written-out path for the scheme's own kernel once it has
        failed (the Fallback's record), or for a dtype it does not take."""
        runs = self.path.explicit_runs if explicit else self.path.runs
        if runs == self.path.own and dtype not in self.own_dtypes:
            return "math"
        if self.fallback is None or self.fallback.failure is None or runs not in ("flex", self.path.own):
            return runs
        return "sdpa" if runs == "flex" else "math"

    def describe(self, dtype: torch.dtype = torch.float32) -> str:
        """The path's line for the model summary, and where a pass in ``dtype`` runs the written-out path instead of
        the scheme's own kernel, that it does and why."""
        if self.path.runs != self.path.own or self.own is None or dtype in self.own_dtypes:
            return self.path.describe()
        takes = ", ".join(sorted(str(kind).removeprefix("torch.") for kind in self.own_dtypes))
        return f"{self.path.describe()} (math in {str(dtype).removeprefix('torch.')}: {self.path.own} takes {takes})"

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall, capture: list | None = None
    ) -> torch.Tensor:
        """The layer's attention; with a ``capture`` list, the written-out path, its probabilities appended to it."""
        if capture is not None:
            out, probs = written_out_attention(q, k, v, call, keep_probs=True)
            capture.append(probs)
            return out
        runs = self.path.explicit_runs if call.state.explicit else self.path.runs
        full = call.state.q_offset == 0 and q.shape[-2] == k.shape[-2]
        own = runs == self.path.own and self.own is not None and q.dtype in self.own_dtypes
        if full and call.cache is None and own:  # it fills no cache
            return self._with_fallback(self.own, math_kernel, q, k, v, call)
        if full and runs == "flex":
            return self._with_fallback(flex_kernel, sdpa_kernel, q, k, v, call)
        return KERNELS["sdpa" if runs == "flex" else "math" if runs == self.path.own else runs](q, k, v, call)

    def _with_fallback(self, first: Kernel, instead: Kernel, q, k, v, call: AttentionCall) -> torch.Tensor:
        if self.fallback is None:
            return first(q, k, v, call)
        return self.fallback.run(first, instead, q, k, v, call)


def resolve_path(pe: PositionalEncoding, backend: str, device: torch.device | str, sink: bool = False) -> AttentionPath:
    """The attention path of a layer that runs ``pe`` on a device of ``device``'s kind, asked for ``backend``, with sink
    logits or not (model.attn_sink): the only place that reads the scheme's interfaces."""
    if backend not in BACKENDS:
        raise PosGPTError(f"unknown model.attn_backend={backend!r}; choose one of {list(BACKENDS)}")
    cuda = torch.device(device).type == "cuda"
    window = pe.score_window() if isinstance(pe, Rotation) else None
    sliding = pe.sliding_window() if isinstance(pe, SlidingWindow) else None
    if sliding is not None and window is not None:
        raise PosGPTError(
            f"pe={pe.name}: a sliding window of {sliding} keys and scores merged from two rotations by distance "
            "do not go together; drop one"
        )
    modifies = frozenset(pe.modifies) if isinstance(pe, ModifiesAttention) else frozenset()
    if sink:  # refused here, where every build and every change of a scheme's settings chooses the path
        _check_sink(pe, window, modifies)
    traits = dict(
        score_bias=isinstance(pe, ScoreBias),
        distance_table=isinstance(pe, DistanceBias),
        table_per_layer=isinstance(pe, LayerwiseBias),
        table_in_score_mod=isinstance(pe, DistanceBias) and isinstance(pe, UncompiledScoreBias),
        modifies=modifies,
        window=window,
        rotate_cached_keys=isinstance(pe, Rotation) and pe.rotation_depends_on_length(),
        sliding_window=sliding,
    )
    if modifies & WRITTEN_OUT_MODS or window is not None:
        # no PyTorch kernel takes these: the scheme's own, where one is installed, for what it can take
        own = isinstance(pe, FusedKernel) and backend != "math" and not sink and sliding is None
        own = own and pe.fused_attention(torch.device(device)) is not None
        name = pe.fused_backend if own else None
        return AttentionPath(name or "math", "math", own=name, **traits)
    if backend == "auto":  # FlexAttention's block mask skips the blocks outside a sliding window
        backend = "flex" if (traits["score_bias"] or modifies or sliding is not None) and cuda else "sdpa"
    explicit_runs = backend
    if backend == "flex" and cuda and isinstance(pe, UncompiledScoreBias):
        # its score_mod cannot be compiled (CPU runs FlexAttention eagerly: it can there); a distance table, read
        # with positions 0..T-1, compiles
        explicit_runs = "sdpa"
        backend = "flex" if traits["distance_table"] else "sdpa"
    return AttentionPath(backend, explicit_runs, **traits)


def _check_sink(pe: PositionalEncoding, window: int | None, modifies: frozenset[str]) -> None:
    """PosGPTError where the path the scheme takes has no softmax denominator for a sink logit (model/sink.py)."""
    if window is not None:
        raise PosGPTError(
            "model.attn_sink: the written-out attention that merges two rotations by distance has no sink "
            "logit; evaluate this run without that variation"
        )
    if "weights" in modifies:
        raise PosGPTError(
            f"model.attn_sink: pe={pe.name} weighs the values by its own rule, not a softmax, so there is no "
            "denominator for a sink logit; train without model.attn_sink"
        )


def choose_kernel(
    pe: PositionalEncoding,
    backend: str,
    device: torch.device | str,
    sink: bool = False,
    fallbacks: dict[str, Fallback] | None = None,
) -> LayerKernel:
    """The kernel of a layer that runs ``pe`` (see :func:`resolve_path`). ``fallbacks``: the model's records, one per
    kernel that may fail, shared by its layers (made here where missing; None: this layer's own)."""
    path = resolve_path(pe, backend, device, sink)
    own = pe.fused_attention(torch.device(device)) if path.own is not None else None
    fallible = path.own if own is not None else "flex" if "flex" in (path.runs, path.explicit_runs) else None
    fallback = None
    if fallible is not None:
        fallbacks = {} if fallbacks is None else fallbacks
        fallback = fallbacks.setdefault(fallible, _fallback_of(fallible, own is not None))
    return LayerKernel(path, own, fallback, pe.fused_dtypes if own is not None else frozenset())


def _fallback_of(name: str, own: bool) -> Fallback:
    if own:
        return Fallback(f"{name} attention failed", "the written-out path runs from now on")
    return Fallback("FlexAttention failed", "attention runs sdpa (bias as a blockwise mask) from now on")


def resolve_backend(
    backend: str,
    pe: PositionalEncoding,
    device: torch.device,
    explicit: bool = False,
    sink: bool = False,
    dtype: torch.dtype = torch.float32,
) -> str:
    """The backend a freshly built model runs for this scheme on this device (a built model's, after a failure:
    ``GPT.attention_backend``); ``explicit``: positions are given per token, so no distance table stands in for the
    scheme's score_bias; ``sink``: the model has sink logits (model.attn_sink); ``dtype``: of q, k and v (the autocast
    dtype; float32 without)."""
    return choose_kernel(pe, backend, device, sink).backend(explicit, dtype)


def resolve_layer_backends(
    backend: str,
    pe: PositionalEncoding,
    device: torch.device,
    explicit: bool = False,
    sink: bool = False,
    dtype: torch.dtype = torch.float32,
) -> str:
    """:func:`resolve_backend` of the scheme each layer runs: one backend, or the distinct ones in layer order joined
    by ``+`` when layers differ (``sdpa+flex``)."""
    schemes = pe.layer_schemes()
    backends = (resolve_backend(backend, scheme, device, explicit, sink, dtype) for scheme, _ in schemes)
    return "+".join(dict.fromkeys(backends))


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pe: PositionalEncoding,
    backend: str,
    state: PositionState | None = None,
    layer: int = 0,
    capture: list[torch.Tensor] | None = None,
    sink: torch.Tensor | None = None,
    mods: Any = None,
    kernel_options: Mapping[str, Any] | None = None,
    x: torch.Tensor | None = None,
) -> torch.Tensor:
    """One layer's attention outside a model (tests, scripts): the kernel chosen here for ``backend``, then run.
    ``state``: the positions (default: keys at 0 .. Tk-1); ``mods``: the scheme's AttentionMods of this pass (None:
    its ``attention_mods`` of the layer input ``x``, None outside a model, which a scheme reads as no input)."""
    if state is None:
        state = default_state(pe, q.shape[-2], k.shape[-2], q.device)
    if mods is None and isinstance(pe, ModifiesAttention):
        mods = functools.partial(pe.attention_mods, x, q, k, layer, None)
    chosen = choose_kernel(pe, backend, q.device, sink is not None)
    call = AttentionCall(pe, chosen.path, state, layer, x, sink, mods, kernel_options)
    return chosen(q, k, v, call, capture)


def _padded(run: Kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall) -> torch.Tensor:
    """``run`` of q, k wider than v (a scheme's rotate may widen them, model/pe/base.py): PyTorch's fused kernels
    take one head size for q, k and v, so v gets zeros up to q's size, and the output drops them."""
    width = v.shape[-1]
    if q.shape[-1] == width:
        return run(q, k, v, call)
    return run(q, k, F.pad(v, (0, q.shape[-1] - width)), call)[..., :width]


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall) -> torch.Tensor:
    state, path, sink, term = call.state, call.path, call.sink, call.mods.pair_term
    full = state.q_offset == 0 and q.shape[-2] == k.shape[-2]
    if not path.score_bias and full and state.documents is None and path.sliding_window is None:  # masks needed
        if term is None and sink is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if term is None:  # a sink (model/sink.py)
            if q.device.type == "cpu":
                return CpuFlashSink.apply(q, k, v, sink)
            q1, k1, v1 = sink_as_key(q, k, v, sink, dummy_query=True)
            return F.scaled_dot_product_attention(q1, k1, v1, is_causal=True, scale=q.shape[-1] ** -0.5)[:, :, 1:]
        folded = term.folded(q, k, v) if sink is None else None
        if folded is not None:
            return folded
    return blockwise_sdpa(q, k, v, call)


def blockwise_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall) -> torch.Tensor:
    """sdpa with model/attention.py's bias and mask as a float mask, one block of queries at a time."""
    state, path, sink = call.state, call.path, call.sink
    Tq, Tk = q.shape[-2], k.shape[-2]
    block = query_block(q, k)
    outputs = []
    # The sink key goes first (model/sink.py), and the scale stays the original head size's.
    shift, scale = (0, {}) if sink is None else (1, {"scale": q.shape[-1] ** -0.5})
    if sink is not None:
        q, k, v = sink_as_key(q, k, v, sink, dummy_query=False)
    for start in range(0, Tq, block):
        stop = min(Tq, start + block)
        # Keys after the last query of the block are masked anyway: slice them off to save work.
        k_stop = min(Tk, state.q_offset + stop)
        mask = bias_and_mask(call, start, stop, k_stop, q.dtype)
        # Keys before the first query's window are masked too: left out as well (the sink key, first, is kept).
        k_start = 0 if path.sliding_window is None or sink is not None else _window_start(path, state, start)
        mask = mask[..., k_start:]
        if sink is not None:
            mask = torch.cat((mask.new_zeros(*mask.shape[:-1], 1), mask), dim=-1)
        if q.device.type == "cpu":
            # PyTorch's CPU flash kernel takes a slow path for a mask broadcast over the batch: give it one mask per
            # row (docs/speed.md). The block size bounds the copy.
            mask = mask.expand(q.shape[0], q.shape[1], -1, -1).contiguous()
        keys = slice(k_start, k_stop + shift)
        queries = q[:, :, start:stop]
        outputs.append(F.scaled_dot_product_attention(queries, k[:, :, keys], v[:, :, keys], attn_mask=mask, **scale))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)


def _window_start(path: AttentionPath, state: PositionState, start: int) -> int:
    """The first key that query ``start`` of a block (index q_offset + start among the keys) sees in its window."""
    return max(0, state.q_offset + start - path.sliding_window + 1)


def check_kernel_options(options: Mapping[str, Any]) -> None:
    """PosGPTError unless each key of ``options`` (``model.flex_kernel_options``) is one of FlexAttention's kernel
    options (torch's ``FlexKernelOptions``), bare or for one pass only (``fwd_``, ``bwd_``), with a number, a boolean
    or a word for its value. Whether a value fits the GPU only its compilation can tell: if it does not, the run warns
    and takes sdpa (the layer's Fallback)."""
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


# Kernels the compiled flex_attention may compile in one process (dynamo's default for a function is 8).
FLEX_RECOMPILE_LIMIT = 32


@functools.cache
def _compiled_flex_attention(backend: str | Callable = "inductor"):
    """flex_attention compiled once for the process (``backend``: torch.compile's; tests pick a lighter one). Its
    shapes change (a task trains on several lengths, evaluation scores every length and batch size): after the first
    change dynamo compiles a kernel generic in that size (automatic dynamic shapes), so a run compiles a few kernels,
    not one per shape (sizes of 1 are kernels of their own, and gradients or none double them), so the limit is
    ``FLEX_RECOMPILE_LIMIT`` here. Past it dynamo would run flex_attention unfused without a word (every score written
    out); here that raises instead, and the layer's Fallback gives FlexAttention up, warned and recorded."""
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
    torch.compile create_block_mask is traced into the graph instead, as dynamo would ignore the cache anyway."""
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
    pair, a dense seq_len x seq_len tensor and its reductions (docs/speed.md, "FlexAttention's block mask"); this needs
    (seq_len / 128)^2 entries. tests/model/test_kernels_flex_all_schemes.py checks it equals create_block_mask's field
    by field.

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


def _score_mod(call: AttentionCall):
    """The scheme's biases as a FlexAttention score_mod (None without any): the score bias, then the pair term's."""
    score_mod = _score_bias_mod(call) if call.path.score_bias else None
    term = call.mods.pair_term
    if term is None:
        return score_mod
    term_mod = term.score_mod()
    if score_mod is None:
        return term_mod

    def both(score, b, h, q_idx, kv_idx):
        return term_mod(score_mod(score, b, h, q_idx, kv_idx), b, h, q_idx, kv_idx)

    return both


def _score_bias_mod(call: AttentionCall):
    """The scheme's score bias as a FlexAttention score_mod. It reads the scheme's parameters, its distance table
    and the position tensors through the closure: FlexAttention lifts such captured tensors into inputs of its
    kernel, so gradients reach learnable bias parameters."""
    pe, state, layer = call.pe, call.state, call.layer
    if call.path.table_in_score_mod and not state.explicit:
        # A gather in the kernel costs shared memory, so the table stands in only for a score_mod that does not
        # compile (docs/speed.md, "FlexAttention's distance table").
        table = distance_bias(call)  # (H, T): queries and keys are the same T tokens here

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


def _flex_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall) -> torch.Tensor:
    state, sink = call.state, call.sink
    score_mod = _score_mod(call)
    options = {} if call.kernel_options is None else {"kernel_options": dict(call.kernel_options)}
    window = call.path.sliding_window
    if state.documents is None:
        block_mask = _causal_block_mask(q.shape[-2], str(q.device), window)
    else:  # one per forward pass, shared by the layers of one window
        block_mask = state.bias_blocks.get(("documents", window))
        if block_mask is None:
            block_mask = state.bias_blocks[("documents", window)] = document_block_mask(state.documents, window)
    flex = _flex_function(q.device)
    if sink is None:
        return flex(q, k, v, score_mod=score_mod, block_mask=block_mask, **options)
    from torch.nn.attention.flex_attention import AuxRequest

    out, aux = flex(q, k, v, score_mod=score_mod, block_mask=block_mask, return_aux=AuxRequest(lse=True), **options)
    return sink_rescale(out, aux.lse, sink)


def _flex_function(device: torch.device):
    """Compiled flex_attention on CUDA (the fused kernel). Inside an enclosing torch.compile (the training
    model) the plain function, which the outer compilation fuses; on CPU too (forward only, unfused)."""
    from torch.nn.attention.flex_attention import flex_attention

    if device.type == "cuda" and not torch.compiler.is_compiling():
        return _compiled_flex_attention()
    return flex_attention
