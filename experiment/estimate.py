"""Predicted memory and FLOPs of a config before launching it: parameters; training memory (weights,
gradients, AdamW's two states, the activations kept for backward, the loss head's buffers); scoring memory at
a given length per attention backend. ``scripts/estimate.py`` prints it; bench/results/ holds its check
against measured peaks (the estimate excludes the interpreter and torch themselves, which on CPU are part of
the measured resident set: compare with the growth over the process's size before the work).

The counts, per token and layer, of values kept for backward (fp32 elements; under bf16 autocast the matmul
inputs are bf16): the two LayerNorm inputs and outputs (4C), q, k, v (3C, +2C rotated copies for a scheme
that rotates), the attention output and its transpose (2C), the MLP's hidden layer before and after GELU
(8C): 17C, 19C rotated. Attention itself keeps per layer: nothing more with flash SDPA or FlexAttention;
the materialised bias mask on the sdpa path of a bias scheme (about B H T^2 / 2 values, query blocks skip
the masked keys); the scores on the math path (a scheme that counts positions from the scores keeps about
MATH_SCORE_COPIES tensors of B H T^2) while its queries make one block, and nothing T x T once they make more,
whose blocks are recomputed in the backward pass: then one block's MATH_BLOCK_PEAK_COPIES tensors of
B H block T at a time (``recomputed_block``).
Each layer is counted with the scheme it runs (``PositionalEncoding.layer_schemes``: a per-layer pattern mixes
them, e.g. a bias mask in some layers and rotated copies in others).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from experiment.build import build_model, model_flops_per_token
from model import attention, kernels
from model.gpt import padded_vocab_size
from model.loss import FUSED_CHUNK, NO_GRAD_CHUNK, use_fused
from model.pe import PositionalEncoding
from model.pe.capabilities import WRITTEN_OUT_MODS, FusedKernel, ModifiesAttention, Rotation, ScoreBias
from training.loop import position_draw

MiB = 2**20
# Tensors of B x H x T^2 the math path of a position-counting scheme keeps per layer for backward: scores,
# gates, counted positions, their floor, weight, the two gathered logits and the probabilities.
MATH_SCORE_COPIES = 8
# Tensors of B x H x block x T at the peak of a block recomputed in the backward pass: those it keeps, and as many
# gradients of them.
MATH_BLOCK_PEAK_COPIES = 2 * MATH_SCORE_COPIES
# Tensors of B x H x T^2 a layer with transported logits keeps for backward while its queries are one block: the
# logits and what their chunked products keep, about twice as much (PaTH, `scripts/estimate.py pe=path --measure`).
TRANSPORTED_KEPT_COPIES = 3
# Per token, per head, in units of (chunk + head size) floats: what a layer with transported logits keeps for every
# block, which then computes its own rows (the chunks' own scores, queries carried back, keys carried on, the WY
# factors, and the solve's inputs and outputs).
TRANSPORTED_CHUNK_COPIES = 4


@dataclass
class MemoryEstimate:
    """Bytes, by part. ``phases``: groups of parts alive at different times (scoring runs a layer's attention,
    then its MLP, ..., then the loss head, each freeing what the next does not need): the total counts every
    part outside the groups plus the largest group, not their sum."""

    parts: dict[str, float]
    phases: tuple[tuple[str, ...], ...] = ()

    @property
    def total(self) -> float:
        phased = {name for phase in self.phases for name in phase}
        always = sum(value for name, value in self.parts.items() if name not in phased)
        return always + max((sum(self.parts[name] for name in phase) for phase in self.phases), default=0.0)

    def mib(self) -> dict[str, float]:
        return {name: round(value / MiB, 1) for name, value in self.parts.items()} | {
            "total": round(self.total / MiB, 1)
        }


def _meta_model(cfg: DictConfig) -> torch.nn.Module:
    """The model as built, on the meta device (shapes only: nothing is allocated or initialised for real)."""
    with torch.device("meta"):
        return build_model(cfg)


def _rotates(pe: PositionalEncoding) -> bool:
    return isinstance(pe, Rotation)


def count_parameters(cfg: DictConfig) -> int:
    return _meta_model(cfg).num_params()


def flops_per_token(cfg: DictConfig) -> float:
    return model_flops_per_token(_meta_model(cfg), cfg.train.seq_len)


def _head_bytes(tokens: int, vocab: int, width: int, fused: bool, grad: bool, act_bytes: int) -> float:
    """The loss head's buffers: with gradients, the fused path's one chunk of logits plus its fp32 weight
    gradient and hidden gradient, or the plain path's (B T, V) logits, upcast copy, log-softmax and gradient;
    without gradients, one chunk of logits and its log-softmax."""
    if not grad:
        rows = min(tokens, max(1, NO_GRAD_CHUNK // vocab))
        return rows * vocab * 4 * 2
    if fused:
        n_chunks = max(1, math.ceil(tokens * vocab / FUSED_CHUNK))
        rows = math.ceil(tokens / n_chunks)
        return rows * vocab * act_bytes + vocab * width * 4 + tokens * width * 4
    return tokens * vocab * (act_bytes + 4 + 4 + 4)


def _modified(scheme: PositionalEncoding) -> frozenset[str]:
    """The fields of model/pe/capabilities.py's AttentionMods that the scheme hands attention."""
    return scheme.modifies if isinstance(scheme, ModifiesAttention) else frozenset()


def transported_bytes(scheme: PositionalEncoding, rows: int, heads: int, T: int, head_size: int, whole: bool) -> float:
    """What a layer with transported logits (AttentionMods.logits) keeps beyond the written-out path's own: with
    its queries in one block (``whole``), that block's logits and the products behind them; otherwise what every
    block computes its rows from, O(T) per head."""
    if "logits" not in _modified(scheme):
        return 0
    if whole:
        return TRANSPORTED_KEPT_COPIES * rows * heads * T * T * 4
    chunk = min(T, scheme.transition_chunk)
    return TRANSPORTED_CHUNK_COPIES * rows * heads * T * (chunk + head_size) * 4


def training_memory(cfg: DictConfig, device: str = "cpu", dtype: torch.dtype = torch.float32) -> MemoryEstimate:
    """Peak memory of one training step (one micro-batch) of ``cfg`` on ``device`` in ``dtype`` (autocast)."""
    m, t = cfg.model, cfg.train
    model = _meta_model(cfg)  # its schemes' flags and backends, and its parameter count
    n_params = model.num_params()
    act = 2 if dtype == torch.bfloat16 else 4
    rows, T = t.batch_size // t.grad_accum_steps, t.seq_len
    tokens = rows * T
    scores = rows * m.n_head * T * T
    # The written-out path recomputes its blocks of queries in the backward pass once they are more than one
    # (model/attention.py): it then keeps no T x T tensor per layer, and one block's at a time peak in the backward.
    block = min(attention._RECOMPUTED_BLOCK, max(1, attention._MAX_BLOCK_SCORES // max(1, rows * m.n_head * T)))
    recomputed = T > block
    # positions per token (randomized, PoSE's): no distance table stands in for the bias
    explicit = position_draw(t.random_positions, t.pose.target_len) is not None

    def backend(scheme: PositionalEncoding) -> str:
        return kernels.resolve_backend(m.attn_backend, scheme, torch.device(device), explicit, m.attn_sink, dtype)

    def layer_bytes(scheme: PositionalEncoding) -> float:
        math_kept = 0 if recomputed else MATH_SCORE_COPIES * scores * 4
        kept = {"math": math_kept, "sdpa": scores / 2 * act if isinstance(scheme, ScoreBias) else 0}
        # the scheme's own kernel (model/pe/base.py, hook 8) keeps no T x T and no transported logits, as flash sdpa
        fused = isinstance(scheme, FusedKernel) and backend(scheme) == scheme.fused_backend
        transported = 0 if fused else transported_bytes(scheme, rows, m.n_head, T, m.n_embd // m.n_head, not recomputed)
        return tokens * (19 if _rotates(scheme) else 17) * m.n_embd * act + kept.get(backend(scheme), 0) + transported

    schemes = [scheme for scheme, _ in model.pe.layer_schemes()]
    written_out = recomputed and any(backend(scheme) == "math" for scheme in schemes)
    vocab = padded_vocab_size(m.vocab_size)
    return MemoryEstimate(
        {
            "weights": n_params * 4,
            "gradients": n_params * 4,
            "optimizer": n_params * 8,
            "activations": sum(layer_bytes(scheme) for scheme in schemes),
            "recomputed_block": MATH_BLOCK_PEAK_COPIES * rows * m.n_head * block * T * 4 if written_out else 0,
            "loss_head": _head_bytes(tokens, vocab, m.n_embd, use_fused(m.fused_ce, torch.device(device)), True, act),
        },
        # The loss head's buffers peak at the loss, a recomputed block later, in its layer's backward pass.
        phases=(("loss_head",), ("recomputed_block",)),
    )


def scoring_memory(cfg: DictConfig, length: int, backend: str, dtype: torch.dtype = torch.float32) -> MemoryEstimate:
    """Peak memory of scoring ``eval.batch_tokens // length`` rows of ``length`` tokens without gradients
    (evaluation/extrapolation.py) on the given attention backend (sdpa, flex or math; sdpa of a bias scheme
    is its blockwise masked path)."""
    m = cfg.model
    model = _meta_model(cfg)
    rows = max(1, cfg.eval.batch_tokens // length)
    tokens = rows * length
    act = 2 if dtype == torch.bfloat16 else 4
    unit = tokens * m.n_embd * act  # one (rows, length, n_embd) activation
    scores = rows * m.n_head * length * length
    budget = attention._MAX_BLOCK_SCORES

    def layer_parts(scheme: PositionalEncoding) -> tuple[float, float]:
        """(attention layer's activations, attention's own) of a layer that runs ``scheme``."""
        if isinstance(scheme, FusedKernel) and backend == scheme.fused_backend:
            attention_bytes = 0  # the scheme's own kernel (model/pe/base.py, hook 8): no T x T, as flash sdpa
        elif backend == "math" or _modified(scheme) & WRITTEN_OUT_MODS:
            attention_bytes = min(scores, budget) * 4 * 4  # scores, bias, fp32 softmax, probabilities
            # a block's rows of logits stand for its q . k; what every block needs
            if "logits" in _modified(scheme):
                attention_bytes += transported_bytes(scheme, rows, m.n_head, length, m.n_embd // m.n_head, whole=False)
        elif backend == "sdpa" and isinstance(scheme, ScoreBias):
            # A block's mask, per row (CPU), cut from a per-head block: at most the budget, and 1/rows more.
            attention_bytes = min(scores, budget) * act * (1 + 1 / rows)
        else:
            attention_bytes = 0  # flash SDPA, FlexAttention: no T x T
        return unit * (9 if _rotates(scheme) else 7), attention_bytes

    # Layers run one at a time: the largest layer's attention is the phase's peak.
    attention_layer, attention_bytes = max((layer_parts(s) for s, _ in model.pe.layer_schemes()), key=sum)
    vocab = padded_vocab_size(m.vocab_size)
    return MemoryEstimate(
        {
            "weights": model.num_params() * 4,
            "residual": tokens * m.n_embd * 4,  # the stream entering the block, fp32 under autocast too
            # Attention: its LayerNorm, qkv, rotated q and k, the output, its transpose, the projection.
            "attention_layer": attention_layer,
            "attention": attention_bytes,
            # MLP: the new residual, its LayerNorm, the hidden layer before and after GELU.
            "mlp_layer": unit * 10,
            # The final LayerNorm and one chunk of logits with its log-softmax.
            "loss_head": unit + _head_bytes(tokens, vocab, m.n_embd, False, False, act),
        },
        phases=(("attention_layer", "attention"), ("mlp_layer",), ("loss_head",)),
    )
