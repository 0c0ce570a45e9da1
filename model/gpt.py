"""A GPT-2-style decoder with a pluggable positional scheme.

    tokens -> token embedding (+ pe.embed) -> n_layer x [x += attn(LN(x)); x += mlp(LN(x))] -> LN -> head

Pre-LayerNorm blocks, causal multi-head self-attention (q/k may be rotated by pe.rotate, scores may get
pe.score_bias, and what pe.attention_mods computes from the layer's input; each layer runs the kernel chosen for it
when the model is built, model/kernels.py), GELU MLP,
output head tied to the token embedding, vocabulary padded to a multiple of 64
(GPT-2's 50257 -> 50304) so the head's matmul has friendly shapes; the padding rows never receive probability
(model/loss.py). Initialisation follows GPT-2: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer),
except the token embedding, which follows ``model.embedding``:

- ``fairseq``: the convention of Vaswani et al. 2017 (sec. 3.4, "we multiply those weights by sqrt(d_model)") as
  fairseq's transformer LM implements it, which Press et al. 2022 used for every scheme they compared:
  ``Embedding()`` in fairseq/models/transformer/transformer_base.py initialises the table N(0, d^-1/2), and
  ``TransformerDecoderBase`` multiplies the looked-up vectors by ``embed_scale = sqrt(embed_dim)``; the tied
  output projection uses the table as is (``share_decoder_input_output_embed``). So the token signal starts
  with unit RMS, the size of a sinusoid added unscaled, and a learned position table starts N(0, d^-1/2)
  (fairseq/modules/positional_embedding.py).
- ``gpt2``: GPT-2's (Radford et al. 2019): N(0, model.init_std), no multiplier; a learned position table the same.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core.domain import check_domains, choice, domain, read_with
from core.errors import PosGPTError
from model.attention import AttentionPath, CausalSelfAttention, KVCache, default_state
from model.documents import within_document_index
from model.fallback import Fallback
from model.kernels import BACKENDS, LayerKernel, check_kernel_options, choose_kernel
from model.loss import FUSED_MODES, lm_head_cross_entropy
from model.pe import ModelDims, PEConfig, PositionState, build_positional_encoding
from model.temperature import TemperatureConfig

EMBEDDINGS = ("fairseq", "gpt2")


@dataclass
class ModelConfig:
    n_layer: int = domain(2, ge=1)
    n_head: int = domain(4, ge=1)
    n_embd: int = domain(256, ge=1)  # shipped default, configs/model/tiny_wide.yaml (tests/house/test_house_rules.py)
    vocab_size: int = domain(50257, ge=1)  # GPT-2 BPE; padded up to a multiple of 64 inside the model
    # off in eval mode: evaluating and sampling read none
    dropout: float = domain(0.0, ge=0, lt=1, commands=("train", "speed", "estimate"))
    bias: bool = True  # biases in Linear and LayerNorm, as GPT-2
    init_std: float = domain(0.02, gt=0)
    attn_backend: str = choice("auto", BACKENDS)  # the kernels of model/kernels.py's registry, or auto
    # the token-embedding convention, shared by every scheme (see above)
    embedding: str = choice("fairseq", EMBEDDINGS)
    # the fused chunked loss: auto (on CPU), always or never (see model/loss.py); sampling computes no loss
    fused_ce: str = choice("auto", FUSED_MODES, commands=("train", "eval", "speed", "estimate"))
    # FlexAttention's kernel options, given to its kernels as they are (block sizes, stages, warps; fwd_/bwd_ for one
    # pass only): a speed setting, same result; empty: FlexAttention's own choice (see model/kernels.py)
    flex_kernel_options: dict[str, Any] = read_with(default_factory=dict, used_with=("attn_backend", ("auto", "flex")))
    # Length-dependent attention temperature (model/temperature.py) and a learned sink logit per head (model/sink.py)
    attn_temperature: TemperatureConfig = field(default_factory=TemperatureConfig)
    attn_sink: bool = False
    # Gated attention (Qiu et al. 2025): each head's output times a sigmoid gate of the layer's input, per channel
    attn_gate: bool = False

    def check_vocabulary(self, n_tokens: int, source: str) -> None:
        """PosGPTError unless every token id of data whose vocabulary is ``n_tokens`` (``source`` says whose) has an
        embedding. A corpus needs the GPT-2 tokenizer's whole vocabulary even where its own ids happen to be smaller:
        its perplexity would otherwise be over a vocabulary that cannot represent the tokenizer's output."""
        if self.vocab_size < n_tokens:
            raise PosGPTError(
                f"model.vocab_size={self.vocab_size} is smaller than the vocabulary of the data ({source}: "
                f"{n_tokens} tokens): raise model.vocab_size to at least {n_tokens}"
            )


def token_embedding_convention(cfg: ModelConfig) -> tuple[float, float]:
    """(std of the token embedding table at initialisation, its multiplier in the forward pass)."""
    if cfg.embedding == "fairseq":
        return cfg.n_embd**-0.5, math.sqrt(cfg.n_embd)
    return cfg.init_std, 1.0


def model_dims(cfg: ModelConfig, train_seq_len: int) -> ModelDims:
    """What a positional scheme knows of the model it sits in (its checks at start-up see the same)."""
    token_init_std, token_scale = token_embedding_convention(cfg)
    return ModelDims(
        cfg.n_embd,
        cfg.n_head,
        cfg.n_embd // cfg.n_head,
        train_seq_len,
        cfg.init_std,
        cfg.n_layer,
        token_init_std=token_init_std,
        token_scale=token_scale,
    )


def padded_vocab_size(vocab_size: int, multiple: int = 64) -> int:
    return math.ceil(vocab_size / multiple) * multiple


def validate_model_config(cfg: ModelConfig) -> None:
    check_domains(cfg, "model.")  # the config's validation did this at start-up; model/ also runs without it
    if cfg.n_embd % cfg.n_head:
        raise PosGPTError(
            f"model.n_embd={cfg.n_embd} is not divisible by model.n_head={cfg.n_head}; "
            "each head gets n_embd/n_head dimensions"
        )
    check_kernel_options(cfg.flex_kernel_options)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, train_seq_len: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg, train_seq_len)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x, pe, state, cache, layer, layer_kernel, capture=None, pe_layer=None):
        x = x + self.attn(self.ln_1(x), pe, state, cache, layer, layer_kernel, capture, pe_layer)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, pe_cfg: PEConfig, train_seq_len: int) -> None:
        super().__init__()
        validate_model_config(cfg)
        self.cfg = cfg
        self.vocab_size = cfg.vocab_size
        self.token_init_std, self.token_scale = token_embedding_convention(cfg)
        dims = model_dims(cfg, train_seq_len)
        self.pe = build_positional_encoding(pe_cfg, dims)
        # The scheme each layer runs, with its own index of the layer: self.pe in every layer, or one of its parts
        # (a per-layer pattern of schemes). The parts are submodules of self.pe, registered there once.
        self.layer_pe = self.pe.layer_schemes()
        self.pe_parts = list(dict.fromkeys(scheme for scheme, _ in self.layer_pe))
        self.layer_part = [self.pe_parts.index(scheme) for scheme, _ in self.layer_pe]
        self.token_embedding = nn.Embedding(padded_vocab_size(cfg.vocab_size), cfg.n_embd)
        self.dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, train_seq_len) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self._init_weights()
        self.resolve_attention_paths()
        for part in self.pe_parts:  # an evaluation-time variation may change a layer's kernel
            part.on_settings_change(self.resolve_attention_paths)

    def resolve_attention_paths(self) -> None:
        """Each layer's attention kernel (model/kernels.py), for a CPU and for a CUDA device: chosen here, once, from
        its scheme, the backend and the sink, and again whenever a scheme's settings change; the forward pass runs
        the one of its device's kind. A kernel that may fail at its first use gets the model's Fallback for it, kept
        across these choices, so that a kernel given up stays given up and the records name what runs."""
        cfg = self.cfg
        self.attention_fallbacks: dict[str, dict[str, Fallback]] = getattr(self, "attention_fallbacks", {})
        self.attention_kernels = {
            kind: [
                choose_kernel(
                    scheme,
                    cfg.attn_backend,
                    kind,
                    cfg.attn_sink,
                    self.attention_fallbacks.setdefault(kind, {}),
                )
                for scheme, _ in self.layer_pe
            ]
            for kind in ("cpu", "cuda")
        }

    def kernels_on(self, device: torch.device) -> list[LayerKernel]:
        """The layers' attention kernels on ``device`` (any device but CUDA takes the CPU's)."""
        return self.attention_kernels["cuda" if device.type == "cuda" else "cpu"]

    def paths_on(self, device: torch.device) -> list[AttentionPath]:
        """The layers' attention paths on ``device``."""
        return [layer_kernel.path for layer_kernel in self.kernels_on(device)]

    def attention_backend(
        self, device: torch.device, explicit: bool = False, dtype: torch.dtype = torch.float32
    ) -> str:
        """The kernel a full pass runs on ``device``, as the runs' records name it (a kernel given up names its
        fallback): one name, or the distinct ones in layer order joined by ``+``. ``explicit``: positions are given per
        token (training's random positions, documents); ``dtype``: the pass's autocast dtype (float32 without)."""
        layers = self.kernels_on(device)
        return "+".join(dict.fromkeys(layer_kernel.backend(explicit, dtype) for layer_kernel in layers))

    def describe_attention(self, device: torch.device, dtype: torch.dtype = torch.float32) -> list[str]:
        """One line per layer: its scheme and the attention path it takes on ``device`` in ``dtype`` (the autocast
        dtype; the model summary); and one for the attention output gate, with its parameters (counted in
        ``num_params`` too), where the model has it."""
        layer_kernels = self.kernels_on(device)
        lines = [
            f"layer {layer}: {scheme.name}: {layer_kernel.describe(dtype)}"
            for layer, ((scheme, _), layer_kernel) in enumerate(zip(self.layer_pe, layer_kernels, strict=True))
        ]
        gates = self.gate_params()
        if gates:
            lines.append(f"attention output gate (sigmoid per head and channel): {gates:,} parameters")
        return lines

    def gate_params(self) -> int:
        """The parameters of the attention output gates (``model.attn_gate``): 0 without them."""
        gates = [block.attn.gate for block in self.blocks if block.attn.gate is not None]
        return sum(p.numel() for gate in gates for p in gate.parameters())

    def _init_weights(self) -> None:
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if name.startswith("pe.") or ".temperature." in name:
                continue  # the scheme and the temperature (model/temperature.py) initialise their own parameters
            if name == "token_embedding.weight":
                nn.init.normal_(p, 0.0, self.token_init_std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln_" in name:
                nn.init.ones_(p)
            elif name.endswith("proj.weight"):  # residual projections: GPT-2's 1/sqrt(2 n_layer)
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * self.cfg.n_layer))
            else:
                nn.init.normal_(p, 0.0, std)

    @property
    def head_weight(self) -> torch.Tensor:
        return self.token_embedding.weight  # tied

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def no_weight_decay(self) -> list[nn.Parameter]:
        """Matrices AdamW must not decay: the scheme declares them (a table of biases)."""
        return self.pe.no_weight_decay()

    def _position_state(
        self,
        idx: torch.Tensor,
        cache: KVCache | None,
        positions: torch.Tensor | None,
        documents: torch.Tensor | None = None,
    ) -> PositionState:
        """Positions of this forward pass, computed once for all layers."""
        T = idx.shape[1]
        if documents is not None:
            return self._document_state(idx, cache, positions, documents)
        if positions is None:
            start = cache.length if cache is not None else 0
            limit = self.pe.max_positions()
            if limit is not None and start + T > limit:
                raise PosGPTError(
                    f"pe={self.pe.name} encodes at most {limit} positions (its table size), "
                    f"but a sequence of {start + T} tokens was given"
                )
            return default_state(self.pe, T, start + T, idx.device, cache.pe_memo if cache is not None else None)
        if cache is not None:
            raise PosGPTError("explicit positions cannot be combined with a KV cache (they are a training setting)")
        if positions.shape not in ((T,), (idx.shape[0], T)):
            raise PosGPTError(
                f"positions must have shape (T,) or (B, T) = {tuple(idx.shape)}; got {tuple(positions.shape)}"
            )
        positions = positions.to(idx.device)
        return PositionState(positions, positions, 0, self.pe.prepare(positions, T, {}), explicit=True)

    def _document_state(
        self, idx: torch.Tensor, cache: KVCache | None, positions: torch.Tensor | None, documents: torch.Tensor
    ) -> PositionState:
        """The positions of rows that hold several documents (model/documents.py): ``positions`` if given, else each
        token's index within its document; and the documents themselves, which attention keeps apart."""
        if cache is not None:
            raise PosGPTError("documents cannot be combined with a KV cache (they are a training setting)")
        if documents.shape != idx.shape or (positions is not None and positions.shape != idx.shape):
            shapes = [tuple(t.shape) for t in (documents, positions) if t is not None]
            raise PosGPTError(
                f"documents and positions must have the shape of the tokens {tuple(idx.shape)}; got {shapes}"
            )
        documents = documents.to(idx.device)
        # Training passes them (training/loop.py), so that they are an input of the compiled model: a tensor computed
        # inside the graph and read by a FlexAttention score_mod fails inductor's lowering on CPU (torch 2.13, seen).
        positions = within_document_index(documents) if positions is None else positions.to(idx.device)
        prepared = self.pe.prepare(positions, idx.shape[1], {})
        return PositionState(positions, positions, 0, prepared, explicit=True, documents=documents)

    def _part_states(self, state: PositionState, cache: KVCache | None) -> list[PositionState]:
        """The positions each distinct scheme of the layers sees (``pe_parts``): ``state`` itself where that is
        the model's scheme; a part of a per-layer pattern gets its own prepared values (with its own memo in a KV
        cache) and its own bias tables, from the same positions."""
        memo = cache.pe_memo if cache is not None else {}
        return [
            state
            if part is self.pe
            else dataclasses.replace(
                state, prepared=part.prepare(state.positions, state.seq_len, memo.setdefault(i, {})), bias_blocks={}
            )
            for i, part in enumerate(self.pe_parts)
        ]

    def hidden_states(
        self,
        idx: torch.Tensor,
        cache: KVCache | None = None,
        positions: torch.Tensor | None = None,
        capture: list[torch.Tensor] | None = None,
        documents: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, T) token ids -> (B, T, C) final hidden states (after the last LayerNorm).

        ``positions``: (T,) or (B, T) increasing integer positions of the tokens (randomized positions in
        training); None means start .. start+T-1, start being the number of cached tokens. ``capture``: a list
        that receives each layer's attention probabilities, float32 (B, H, T, T), in layer order (the written-out
        attention then runs; evaluation/attention_stats.py). ``documents``: (B, T) the document of each token, ids
        growing along a row (data.document_aware; model/documents.py): attention stays within a document, and
        ``positions`` default to each token's index within its document (0 at its first token)."""
        state = self._position_state(idx, cache, positions, documents)
        states = self._part_states(state, cache)
        if cache is not None and not cache.keys:
            cache.keys, cache.values = [None] * len(self.blocks), [None] * len(self.blocks)
            cache.layer_memo = [{} for _ in self.blocks]
        x = self.token_embedding(idx) * self.token_scale
        position_vectors = self.pe.embed(state.positions.reshape(-1))
        if position_vectors is not None:
            x = x + position_vectors.view(*state.positions.shape, -1).to(x.dtype)
        x = self.dropout(x)
        kernels = self.kernels_on(idx.device)
        for layer, (block, (scheme, pe_layer)) in enumerate(zip(self.blocks, self.layer_pe)):
            x = block(x, scheme, states[self.layer_part[layer]], cache, layer, kernels[layer], capture, pe_layer)
        return self.ln_f(x)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        reduction: str = "mean",
        cache: KVCache | None = None,
        positions: torch.Tensor | None = None,
        capture: list[torch.Tensor] | None = None,
        score_from: int = 0,
        documents: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Without targets: logits (B, T, vocab_size). With targets: the cross-entropy (see model/loss.py) of
        the positions from ``score_from`` on; the head is not computed before it (a window whose first
        positions are context only), and ``reduction="none"`` gives (B, T - score_from).
        ``cache``, ``positions``, ``capture``, ``documents``: see :meth:`hidden_states`."""
        hidden = self.hidden_states(idx, cache, positions, capture, documents)
        if targets is None:
            return (hidden @ self.head_weight.t())[..., : self.vocab_size]
        return lm_head_cross_entropy(
            hidden[:, score_from:],
            self.head_weight,
            targets[:, score_from:],
            reduction,
            vocab_size=self.vocab_size,
            fused=self.cfg.fused_ce,
        )
