"""PaTH attention (Yang, Shen, Wen, Tan, Mishra, Ren, Panda & Kim 2025, "PaTH Attention: Position Encoding via
Accumulating Householder Transformations", NeurIPS 2025): no rotation and no bias of the distance; the key is carried
to the query through one data-dependent Householder-like transition per token between them,

    H_t  = I - beta_t w_t w_t^T,       w_t a unit vector and beta_t in (0, 2), both from the token's input x_t
    A_ij = q_i^T (H_i H_{i-1} ... H_{j+1}) k_j        for j <= i (the empty product, I, for j = i)
    o_i  = sum_{j<=i} softmax_j(A_ij / sqrt(d)) v_j

per layer and head, so order enters through what the tokens between key and query do to it, not through a position.

As in the paper's layer (flash-linear-attention's ``fla/layers/path_attn.py``, ``PaTHAttention``, one key head per
query head): per layer, w_t = normalise(W_up W_down x_t) per head, a projection of rank ``pe.w_rank`` (32: the
reference's ``nn.Linear(hidden, 32) -> nn.Linear(32, kv_dim)``, both without bias) of the normalised input of the
attention; beta_t = 2 sigmoid(u_h^T x_t + b_h) (``bt_proj``, with bias), 2 so that H_t may have the eigenvalue
1 - beta < 0. Weights N(0, model.init_std), biases 0 (so beta starts near 1); the biases are not decayed. The reference
also runs a short causal convolution (3 taps, SiLU) over W_down x before the normalisation (``use_w_shortconv``); it is
not part of this scheme: it would mix the inputs of neighbouring tokens into w, which the KV cache would then have to
carry per layer and packed documents reset at their boundaries, for a local smoothing of w that the equation does not
need.

PaTH-FoX (``pe.forget_gate=true``; off by default, as the reference's ``use_forget_gate=False``): FoX's forget gate
added to the logits, f_t = sigmoid(v_h^T x_t + c_h) per head, through FoX's term c_i - c_j (model/pe/fox.py):

    A_ij / sqrt(d) + (sum_{l=j+1..i} log f_l) / sqrt(d)

divided by sqrt(d) as the reference's kernels and naive code do (they add the gate before the scale), unlike FoX's own
unscaled bias (model/pe/fox.py).

How it is computed (``attention_mods``): from the layer's input the scheme computes its per-token (w, beta) and hands
attention A_ij of the new queries over every key as a function of a block of queries, which the written-out path calls
per block before it scales, masks and softmaxes that block's rows (so no more rows than a block's exist at once, and
training recomputes them in the backward pass). Within chunks of 64 tokens the product of transitions has the
compact WY (UT) form: with W the chunk's w_t as rows and L = strictly lower (diag(beta) W W^T),

    H_s ... H_0 = I - W^T mask_s Y,      Y = (I + L)^{-1} diag(beta) W      (mask_s: rows 0..s)

one triangular solve per chunk, from which every query is carried back to its chunk's start, every key on to its
chunk's end, and the scores within a chunk follow (once per call, for every chunk); across chunks, a block's
queries are carried back one chunk at a time (a rank-64 update per chunk, the block's chunks at once), so a block
ending at token t takes t / 64 steps of batched products, with O(T^2 d) work in all as attention itself. In float32
(float64 stays float64) whatever q's dtype.

KV cache. The cache keeps each key already carried through the transitions of every token after it (H is symmetric,
so carrying the key forward is carrying the query back): a new token carries the cached keys through its H first, and
its own key enters untransformed. Token positions are never read: randomized positions are refused as for NoPE.

On CUDA with flash-linear-attention installed (PyPI ``fla-core``), a full causal pass (training, scoring) runs the
reference's Triton kernel instead (``parallel_path_attn``, head sizes 16-128; ``fused_attention``), recorded as
``attn_backend=fla``; decoding from a KV cache, a sink and packed documents run the written-out path.
tests/model/test_kernels_fused_attention.py compares the two, the kernel run by Triton's CPU interpreter and on CUDA.
Its cost on CPU against RoPE's is in docs/speed.md ("PaTH attention on CPU").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core.domain import domain
from model.pe.base import ModelDims, PEConfig, PositionalEncoding
from model.pe.capabilities import AttentionMods, CacheSlot, FusedKernel, ModifiesAttention
from model.pe.fox import cumulative_term

# Tokens per chunk of the WY form: the reference's block size on a GPU; products within a chunk are (64 x 64) matrices.
CHUNK = 64


@dataclass
class PaTHConfig(PEConfig):
    name: str = "path"
    w_rank: int = domain(32, ge=1)  # rank of the projection of x_t onto w_t (the reference's 32)
    forget_gate: bool = False  # true: PaTH-FoX, FoX's forget gate on the logits (divided by sqrt(d))


class PaTHPositionalEncoding(ModifiesAttention, FusedKernel, PositionalEncoding):
    name = "path"
    config_class = PaTHConfig
    modifies = frozenset({"logits"})
    # Tokens per chunk of the logits' products, which each block of queries computes its rows from (memory model).
    transition_chunk = CHUNK
    fused_backend = "fla"
    fused_kernel = ("fla.ops.path_attn", "parallel_path_attn")
    # in float32 its backward kernel (intra_chunk_preprocess_bwd) asks for more shared memory than an H200 has
    # (245,760 bytes of 232,448): a float32 pass runs the written-out path
    fused_dtypes = frozenset({torch.bfloat16, torch.float16})

    def __new__(cls, *args: Any, **kwargs: Any) -> PaTHPositionalEncoding:
        """PaTH-FoX (``pe.forget_gate``) is PaTH with FoX's cumulative bias: built as the subclass that adds it."""
        cfg = args[0] if args else kwargs.get("cfg")
        if cfg is not None and cfg.forget_gate and not issubclass(cls, GatedPaTHPositionalEncoding):
            cls = GatedPaTHPositionalEncoding
        return super().__new__(cls)

    def __init__(self, cfg: PaTHConfig, dims: ModelDims) -> None:
        super().__init__(cfg, dims)
        L, H, C, std = dims.n_layer, dims.n_head, dims.n_embd, dims.init_std
        self.w_down = nn.Parameter(torch.randn(L, cfg.w_rank, C) * std)
        self.w_up = nn.Parameter(torch.randn(L, H * dims.head_dim, cfg.w_rank) * std)
        self.beta_weight = nn.Parameter(torch.randn(L, H, C) * std)
        self.beta_bias = nn.Parameter(torch.zeros(L, H))
        # The gate's parameters exist only when it is on (a checkpoint without the gate has none).
        if cfg.forget_gate:
            self.gate_weight = nn.Parameter(torch.randn(L, H, C) * std)
            self.gate_bias = nn.Parameter(torch.zeros(L, H))

    def no_weight_decay(self) -> list[nn.Parameter]:
        return [self.beta_bias] + ([self.gate_bias] if self.cfg.forget_gate else [])

    def transitions(self, x: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's input x (B, T, C) -> (w, beta): unit vectors (B, H, T, D) and beta in (0, 2), (B, H, T)."""
        B, T, _ = x.shape
        w = F.linear(F.linear(x, self.w_down[layer]), self.w_up[layer])
        w = F.normalize(w.view(B, T, self.dims.n_head, -1).transpose(1, 2), dim=-1)
        beta = 2 * torch.sigmoid(F.linear(x, self.beta_weight[layer], self.beta_bias[layer]))
        return w, beta.transpose(1, 2)

    def _log_forget(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """log f_t, (B, T, H) float32."""
        return F.logsigmoid(F.linear(x, self.gate_weight[layer], self.gate_bias[layer]).float())

    def fused_attention(self, device: torch.device) -> Callable[..., torch.Tensor] | None:
        """flash-linear-attention's Triton kernel of PaTH (and PaTH-FoX) attention (``parallel_path_attn``, the
        reference's), on CUDA where it is installed and takes the head size (16, 32, 64 or 128)."""
        kernel = self._kernel
        if device.type != "cuda" or kernel is None or self.dims.head_dim not in (16, 32, 64, 128):
            return None

        def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call) -> torch.Tensor:
            x, layer = call.x, call.layer
            w, beta = self.transitions(x, layer)
            # the kernel's (B, T, H, .) layout; w, beta and the gate in float32 (it asks for them so); the gate is
            # log f_t, which the kernel adds before the scale, as cumulative_bias's division does
            scale = q.shape[-1] ** -0.5
            q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
            w, beta = w.transpose(1, 2).float().contiguous(), beta.transpose(1, 2).float().contiguous()
            gate = self._log_forget(x, layer).contiguous() if self.cfg.forget_gate else None
            out, _ = kernel(q, k, v, w, beta, gate, scale=scale)
            return out.transpose(1, 2)

        return attention

    def attention_mods(
        self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, layer: int, cache: CacheSlot | None
    ) -> AttentionMods:
        """The transported logits in place of q . k; with a KV cache, the keys carried through the new tokens, which
        the cache keeps in place of the keys as they came."""
        if x is None:  # attention outside a model (model/kernels.py's attend): no input, no transitions
            return AttentionMods()
        logits, carried = self.transported_scores(q, k, self.transitions(x, layer), carry=cache is not None)
        return AttentionMods(logits=logits, cached_keys=carried)

    def transported_scores(
        self, q: torch.Tensor, k: torch.Tensor, transitions: tuple[torch.Tensor, torch.Tensor], carry: bool
    ) -> tuple[Callable[[int, int], torch.Tensor], torch.Tensor | None]:
        """A_ij of the module docstring for the new queries q (B, H, Tq, D) over the keys k (B, H, Tk, D): the cached
        ones first, already carried to the last cached token, then the Tq new ones, whose ``transitions`` (w, beta)
        these are. Returns ``rows(start, stop)``, the logits of queries start..stop-1 over every key, (B, H, stop -
        start, Tk) float32 (float64 for float64 q), computed for those rows alone (what every chunk needs is made
        here, once), and with ``carry``, every key carried through all of the new tokens, (B, H, Tk, D) in k's dtype,
        for the cache."""
        w, beta = transitions
        dtype = torch.promote_types(q.dtype, torch.float32)
        n_new = q.shape[-2]
        cached, new = k[..., : k.shape[-2] - n_new, :].to(dtype), k[..., k.shape[-2] - n_new :, :]
        chunk = min(CHUNK, n_new)
        q, new, w = (_chunked(t.to(dtype), chunk) for t in (q, new, w))
        beta = _chunked(beta.to(dtype)[..., None], chunk)[..., 0]
        local, q_start, k_end, y = _within_chunks(q, new, w, beta)

        def rows(start: int, stop: int) -> torch.Tensor:
            first = start // chunk
            scores, q_back = _across_chunks(local, q_start, k_end, w, y, first, -(-stop // chunk), cached.shape[-2] > 0)
            start, stop = start - first * chunk, stop - first * chunk
            scores = scores[..., start:stop, :n_new]
            if q_back is None:
                return scores
            return torch.cat((q_back[..., start:stop, :] @ cached.transpose(-2, -1), scores), dim=-1)

        carried = _carried_keys(cached, k_end, w, y)[..., : k.shape[-2], :].to(k.dtype) if carry else None
        return rows, carried


class GatedPaTHPositionalEncoding(PaTHPositionalEncoding):
    """PaTH-FoX: PaTH's transported logits plus FoX's forget gate, c_i - c_j with g_t = log f_t / sqrt(d) (the
    module docstring; the term is FoX's, model/pe/fox.py). The registry knows PaTH alone (pe=path);
    ``pe.forget_gate=true`` builds this class."""

    modifies = frozenset({"logits", "pair_term"})

    def attention_mods(
        self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, layer: int, cache: CacheSlot | None
    ) -> AttentionMods:
        if x is None:
            return AttentionMods()
        gate = cumulative_term(self.cumulative_bias(x, layer), cache)
        return dataclasses.replace(super().attention_mods(x, q, k, layer, cache), pair_term=gate)

    def cumulative_bias(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """log f_t / sqrt(d), (B, H, T) float32, from the layer's input x (B, T, C): PaTH-FoX's gate."""
        return self._log_forget(x, layer).transpose(1, 2) / math.sqrt(self.dims.head_dim)


def _chunked(t: torch.Tensor, chunk: int) -> torch.Tensor:
    """(B, H, T, D) -> (B, H, N, chunk, D), zeros after the last token (a zero beta is the identity transition)."""
    pad = -t.shape[-2] % chunk
    t = F.pad(t, (0, 0, 0, pad))
    return t.view(*t.shape[:-2], t.shape[-2] // chunk, chunk, t.shape[-1])


def _within_chunks(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per chunk (all (B, H, N, C, .), tokens s, j, i of the chunk):

    - the scores within it, q_i^T H_i ... H_{j+1} k_j (for j <= i; the rest is masked later);
    - each query carried back to the chunk's start, q_i^T H_i ... H_0;
    - each key carried on to the chunk's end, H_{C-1} ... H_{j+1} k_j;
    - Y of the WY form H_{C-1} ... H_0 = I - W^T Y.

    Carrying a vector v through H_s ... takes off w_s a_s with a_s = beta_s w_s^T v - beta_s sum_{r<s} (w_s^T w_r)
    a_r, a triangular system (I + L) a = beta W v: Y solves it for the rows of W, Z for the keys (its column j is zero
    down to row j, as key j meets the transitions after it only)."""
    C = w.shape[-2]
    lower = torch.ones(C, C, dtype=torch.bool, device=w.device).tril(-1)
    wb = w * beta[..., None]
    system = (wb @ w.transpose(-2, -1)).masked_fill(~lower, 0)
    rhs = torch.cat((wb, (wb @ k.transpose(-2, -1)).masked_fill(~lower, 0)), dim=-1)
    # in float32 at least: autocast hands this bfloat16 products, and CUDA has no triangular solve in bfloat16
    precise = torch.promote_types(system.dtype, torch.float32)
    solved = torch.linalg.solve_triangular(system.to(precise), rhs.to(precise), upper=False, unitriangular=True)
    solved = solved.to(rhs.dtype)
    y, z = solved[..., : w.shape[-1]], solved[..., w.shape[-1] :]
    qw = (q @ w.transpose(-2, -1)).tril()  # q_i . w_s for the transitions s <= i the query passes
    local = q @ k.transpose(-2, -1) - qw @ z
    return local, q - qw @ y, k - z.transpose(-2, -1) @ w, y


def _across_chunks(
    local: torch.Tensor,
    q_start: torch.Tensor,
    k_end: torch.Tensor,
    w: torch.Tensor,
    y: torch.Tensor,
    first: int,
    last: int,
    need_back: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The scores of query chunks first..last-1 over every key, (B, H, (last - first) C, N C) (zero above the chunks'
    diagonal), from the chunks' own (``local``) and those of query chunk n over key chunk m < n: n's queries, carried
    back to their chunk's start, then through chunks n-1 .. m+1, times m's keys carried to m's end. Step s does every
    pair n - m = s of these rows at once, then carries their queries through chunk m. With ``need_back``, also each of
    these queries carried back to the first token, (B, H, (last - first) C, D)."""
    B, H, N, C, _ = local.shape
    if N == 1:  # one chunk (the training lengths, a decoding step): its own scores are all of them
        return local.view(B, H, C, C), (q_start.view(B, H, C, -1) if need_back else None)
    blocks = local.new_zeros(B, H, last - first, C, N, C)
    chunks = torch.arange(N, device=local.device)
    blocks[:, :, chunks[: last - first], :, chunks[first:last]] = local[:, :, first:last].permute(2, 0, 1, 3, 4)
    queries, back, low = q_start[:, :, first:last], [], first  # queries: rows low..last-1
    if first == 0:  # the first chunk's queries are at the first token already
        queries, back, low = queries[:, :, 1:], [queries[:, :, :1]], 1
    for s in range(1, last):
        low = max(low, s)  # rows before s have no key chunk s back: carried through chunk 0 already
        keys = slice(low - s, last - s)
        products = queries @ k_end[:, :, keys].transpose(-2, -1)
        blocks[:, :, chunks[low - first : last - first], :, chunks[keys]] = products.permute(2, 0, 1, 3, 4)
        if s == last - 1 and not need_back:
            break
        queries = queries - (queries @ w[:, :, keys].transpose(-2, -1)) @ y[:, :, keys]
        if low == s:  # row s has been carried through chunk 0, to the first token
            back.append(queries[:, :, :1])
            queries = queries[:, :, 1:]
    scores = blocks.view(B, H, (last - first) * C, N * C)
    return scores, (torch.cat(back, dim=2).view(B, H, (last - first) * C, -1) if need_back else None)


def _carried_keys(cached: torch.Tensor, k_end: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Every key carried through the transitions of every token after it: the cached keys through every chunk, each
    chunk's keys (carried to its end) through the chunks after it; (B, H, P + N C, D)."""
    keys = cached
    for c in range(k_end.shape[2]):
        keys = torch.cat((keys - (keys @ y[:, :, c].transpose(-2, -1)) @ w[:, :, c], k_end[:, :, c]), dim=-2)
    return keys
