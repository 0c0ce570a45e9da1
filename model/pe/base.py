"""The one interface every positional scheme implements.

Position can enter a transformer in seven places. A scheme overrides the hooks it uses and inherits no-ops
for the rest:

1. ``embed(positions)``      -> a vector per position, added to the token embeddings (sinusoidal, learned)
2. ``rotate(q, k, positions, seq_len, prepared)`` -> q and k transformed in every attention layer (RoPE, xPos)
3. ``score_bias(q_pos, k_pos, head, layer)`` -> a term added to attention scores (ALiBi, T5, KERPLE, FIRE)
4. ``content_bias(q, scores, layer)`` -> a term computed from the scores themselves (CoPE); such a scheme
   always runs the written-out attention path
5. ``cumulative_bias(x, layer)`` -> a term per token and head, g_t, computed from the layer's input x (so from
   the data, per batch row and layer); the score of query i over key j gets the sum of g over the tokens after
   j up to i, c_i - c_j with c = cumsum(g) (FoX's log forget gates; ALiBi would be g = -slope)
6. ``attention_weights(scores, layer)`` -> the weights that multiply the values in place of softmax over the scores,
   computed from the scaled, causally masked scores of a block of queries (stick-breaking: order enters through
   the weights themselves); such a scheme always runs the written-out attention path, in blocks of queries, so its
   weights must treat each query's row on its own
7. ``transitions(x, layer)`` and ``transported_scores(q, k, transitions, carry)`` -> the logit of query i over key j
   taken through a linear map made of one transition per token between them, q_i . T_i T_{i-1} ... T_{j+1} k_j, each
   T_t computed from the layer's input x (so from the data, per batch row and layer; PaTH's Householder-like
   reflections); such a scheme always runs the written-out path, which takes these logits in place of q_i . k_j,
   one block of queries at a time

One more hook is not a place for position but a faster way to the same numbers: ``fused_attention(device)`` -> a
kernel that computes a scheme's whole attention (hooks 6 and 7 above, which have no PyTorch kernel) in one pass, where
an installed package provides it (its reference's Triton kernel on a GPU), or None. Attention runs it for full causal
passes on ``device`` (training, scoring) and names it in the runs' records (``fused_backend``; ``fused_kernel`` says
which package's function it is, imported when the scheme is built); anything it cannot
take (a KV cache, captured probabilities, packed documents, a sink) runs the written-out path (model/attention.py).

``score_bias`` is written once as an elementwise function of broadcastable integer tensors. The attention
code turns it into a FlexAttention ``score_mod`` on GPU (scalar tensors per score) or a materialised bias
block on CPU (via ``bias_block``, which a scheme may override with a faster whole-block version); the
scheme never knows which.

Per forward pass. What does not depend on the layer (RoPE's cos/sin) is computed once by ``prepare`` and
handed to every layer in a :class:`PositionState`. A bias that depends only on the distance
(``bias_is_relative``: ALiBi, T5, KERPLE) is evaluated once per distance and forward pass (per layer if
``bias_depends_on_layer``: KERPLE), by ``bias_block``; each block of queries is cut from that table, and
FlexAttention's score_mod reads it (model/attention.py). Schemes
with per-layer parameters (KERPLE, FIRE, CoPE) get ``ModelDims.n_layer`` and index them by ``layer``.

Per layer. The model asks the scheme which scheme runs each layer (``layer_schemes``): itself in every layer,
unless it is composed of others per layer (hybrid.py: RoPE in some layers, NoPE in others). Each layer then
sees only its own scheme, with its own prepared values and bias tables, and picks its attention path alone.

A cumulative bias is data: the attention layer computes c = cumsum(g) over the sequence and hands it to
``attend``, which adds c_i - c_j to the mask blocks (CPU), in the FlexAttention ``score_mod`` (GPU), or to the
written-out scores; a KV cache keeps c of the cached keys so the sums continue across decoding steps. Positions
do not enter it, so such a scheme alone does not use positions (``uses_positions``).

Transported logits are data too: the attention layer hands the scheme the transitions of its new tokens and every key,
and ``attend`` gets the logits of the new queries over all keys (model/gpt.py). A KV cache keeps each key carried
through the transitions of every token after it (what ``carry`` returns), so that a new token only carries the cached
keys through its own transitions.

Scores merged by distance. A scheme may score near and far pairs with different rotations (RoPE's remaps,
Self-Extend, ReRoPE and STRING): ``score_window()`` then returns the window W, ``rotate`` returns q and k with the two
rotations side by side on the last dimension, (near, far), and attention takes q_near . k_near where
0 <= q_pos - k_pos < W and q_far . k_far beyond (model/windowed_attention.py, on the written-out path).

Wider q and k. ``rotate`` may return q and k of another head size than v's (a scheme that maps each coordinate to
a complex number returns 2d real ones): attention scales their scores by 1 / sqrt(size of q) (scores merged by
distance, above, by 1 / sqrt(size of v)), so the scheme folds into q the scale it means, and the kernels pad v to
q's size (model/attention.py), so the fused causal kernel still runs.

Positions are (T,) for every row, or (B, T) when each row has its own (randomized positions in training,
Ruoss et al. 2023); every hook accepts both.

Evaluation-time variations. A scheme may declare fields of its config that an evaluation may change without
changing what the trained weights compute (``eval_time_settings``; RoPE's context extension) and the entries
of ``eval.variations`` it understands. Everything about them is the scheme's: checking them with the config
(``check_variations``), parsing an entry (``parse_variation``), naming one in tables and files
(``variation_label``), applying one to the built model (``evaluated_with``), and what a run fine-tuned from
another inherits (``inherit``). Code outside ``model/pe/`` only calls these hooks and never names a scheme or
its settings (tests/test_house_rules.py).

Each scheme is a module in ``model/pe/`` that defines a subclass with ``name`` set and a config dataclass
(subclass of :class:`PEConfig`) in ``config_class``; ``model/pe/__init__.py`` discovers it, so adding a
scheme is one module plus one ``configs/pe/<name>.yaml``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from core.domain import check_domains
from core.errors import PosGPTError, first_line, warn


@functools.cache
def installed_kernel(module: str, name: str) -> Callable[..., Any] | None:
    """``name`` of the module ``module`` of an installed package (a scheme's reference kernel, hook 8), imported at its
    first use; None where the package or what it needs is not installed (a Triton kernel without Triton), or where it
    fails to import (said once). The written-out path then runs, and the runs' records name it."""
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError:
        return None
    except Exception as error:  # whatever the package raises at import (a driver, a compiler)
        warn(f"{module} cannot be imported ({first_line(error)}); the written-out path runs")
        return None


@dataclass
class PEConfig:
    """Parameters common to all schemes; a scheme's own dataclass adds its fields."""

    name: str = "none"


@dataclass(frozen=True)
class ModelDims:
    """What a scheme needs to know about the model it sits in."""

    n_embd: int
    n_head: int
    head_dim: int
    train_seq_len: int  # the context length the model is (or was) trained at
    init_std: float  # std of weight matrices at initialisation (model.init_std)
    n_layer: int = 1  # for schemes with parameters per layer
    # The token embedding under model.embedding (model/gpt.py): the std of its table at initialisation (None:
    # init_std) and its multiplier in the forward pass.
    token_init_std: float | None = None
    token_scale: float = 1.0

    @property
    def embedding_std(self) -> float:
        """Std of the token embedding table at initialisation."""
        return self.init_std if self.token_init_std is None else self.token_init_std

    @property
    def token_rms(self) -> float:
        """RMS of the token signal entering the first block at initialisation: the table's std x multiplier."""
        return self.embedding_std * self.token_scale


@dataclass
class PositionState:
    """Positions of one forward pass, shared by every layer.

    Queries are the new tokens; keys are all tokens attended to (cached ones first). The causal mask is by
    index (key index <= query index + q_offset); positions only feed the scheme, so they may be any
    increasing sequence.
    """

    positions: torch.Tensor  # (Tq,) or (B, Tq): positions of the queries
    key_positions: torch.Tensor  # (Tk,) or (B, Tk)
    q_offset: int  # index of the first query among the keys
    prepared: Any = None  # the scheme's per-forward values, from PositionalEncoding.prepare
    explicit: bool = False  # positions were given (not q_offset .. q_offset + Tq - 1)
    bias_blocks: dict = field(default_factory=dict)  # materialised bias blocks shared by the layers
    # (B, Tq) the document of each token (data.document_aware, model/documents.py): attention stays within it; None:
    # one sequence per row
    documents: torch.Tensor | None = None

    @property
    def seq_len(self) -> int:
        return self.key_positions.shape[-1]


@dataclass(frozen=True)
class SchemeRecord:
    """What the rest of posgpt says about a scheme besides its mathematics, declared beside its class in the
    scheme's own module (a module-level ``SchemeRecord("rope", colour=...)``, found by the registry; a scheme
    without one gets the defaults):

    - ``colour``: its colour in every plot ("": a hue from a hash of its name, evaluation/plots.py);
      ``display_name``: its name in comparison tables ("": its name);
    - ``study_variations``: the eval.variations entries (see parse_variation) scripts/study.sh evaluates every run
      of the scheme with, besides the run as trained (empty: the run as trained only);
    - ``legacy_values``: settings the scheme gained after checkpoints of it were first written, whose default
      today is not what those checkpoints were trained with: a checkpoint without the key gets this value
      (experiment/settings.py).
    """

    scheme: str
    colour: str = ""
    display_name: str = ""
    study_variations: tuple[str, ...] = ()
    legacy_values: dict[str, Any] = field(default_factory=dict)


class PositionalEncoding(nn.Module):
    """Base class: no position at all. Subclasses override the hooks they use."""

    name: ClassVar[str] = ""
    config_class: ClassVar[type[PEConfig]] = PEConfig
    # True when score_bias is overridden: attention must then use a path that can add a bias.
    has_score_bias: ClassVar[bool] = False
    # False when score_bias is the same in every layer: attention then builds it once per forward pass.
    bias_depends_on_layer: ClassVar[bool] = False
    # True when score_bias depends on the positions only through q_pos - k_pos (ALiBi, T5, KERPLE; not FIRE,
    # whose normaliser reads q_pos): with positions 0..T-1 attention then evaluates it once per distance, into a
    # table of (H, T) values per forward pass that sdpa cuts its mask blocks from and, where score_bias does not
    # compile (below), FlexAttention's score_mod reads (``table[h, q - k]``), not once per score.
    bias_is_relative: ClassVar[bool] = False
    # False when inductor cannot compile score_bias itself into a FlexAttention score_mod with its gradients (FIRE's
    # MLP, KERPLE's per-layer parameters indexed twice; seen on an H200): where the score_mod would run it (a bias
    # that is not relative, or positions given per token) the bias goes through sdpa as a mask on GPU, block by block.
    # A relative bias is then read from its distance table, which compiles (a table read costs the kernel shared
    # memory, so one that compiles computes its bias in the kernel instead). FlexAttention's backward is compiled
    # at the first backward pass, where no fallback can catch it.
    score_mod_compiles: ClassVar[bool] = True
    # True when content_bias is overridden: attention always runs the written-out path.
    has_content_bias: ClassVar[bool] = False
    # True when cumulative_bias is overridden: each layer computes its terms from its input (model/gpt.py).
    has_cumulative_bias: ClassVar[bool] = False
    # True when attention_weights is overridden: its weights replace softmax, so attention always runs the
    # written-out path (and has no softmax denominator for a sink logit).
    has_attention_weights: ClassVar[bool] = False
    # True when transitions and transported_scores are overridden: each layer computes the logits from its input
    # (model/gpt.py), and attention always runs the written-out path.
    has_transitions: ClassVar[bool] = False
    # Tokens per chunk of those logits' products, which each block of queries computes its rows from (memory model).
    transition_chunk: ClassVar[int] = 0
    # The attention backend that fused_attention's kernel is recorded as (None: the scheme has no such kernel), and
    # (module, name) of that kernel in its package: imported when the scheme is built, where CUDA is (``_kernel``).
    fused_backend: ClassVar[str | None] = None
    fused_kernel: ClassVar[tuple[str, str] | None] = None
    # The scheme's own config fields that may change at evaluation/sampling time without changing what the
    # trained weights compute (RoPE: ("scaling",)).
    eval_time_settings: ClassVar[tuple[str, ...]] = ()

    def __init__(self, cfg: PEConfig, dims: ModelDims) -> None:
        super().__init__()
        check_domains(cfg, "pe.")  # the config's validation did this at start-up; model/ also runs without it
        self.cfg = cfg
        self.dims = dims
        # not imported in the forward pass that torch.compile traces; only where CUDA is (a Triton kernel needs it)
        cuda = self.fused_kernel is not None and torch.cuda.is_available()
        self._kernel = installed_kernel(*self.fused_kernel) if cuda else None

    @classmethod
    def uses_positions(cls) -> bool:
        """Whether the scheme overrides a hook that takes token positions (NoPE and CoPE do not)."""
        hooks = ("embed", "rotate", "score_bias")
        return any(getattr(cls, hook) is not getattr(PositionalEncoding, hook) for hook in hooks)

    def max_positions(self) -> int | None:
        """The longest sequence this scheme can encode, or None when it is defined for any length."""
        return None

    def beyond_reach(self, length: int) -> str | None:
        """Why a window of ``length`` positions cannot be scored (a result row's ``reason``); None when it can."""
        limit = self.max_positions()
        return None if limit is None or length <= limit else f"pe={self.name} encodes at most {limit} positions"

    def check_random_positions(self, n_positions: int) -> None:
        """PosGPTError unless training with positions drawn from [0, n_positions) makes sense for this scheme."""
        if not self.uses_positions():
            raise PosGPTError(
                f"train.random_positions: pe={self.name} does not use token positions, so there is "
                "nothing to randomize; drop train.random_positions"
            )
        limit = self.max_positions()
        if limit is not None and n_positions > limit:
            raise PosGPTError(
                f"train.random_positions={n_positions}: pe={self.name} encodes at most {limit} "
                "positions (its table size); enlarge the table or lower train.random_positions"
            )

    @classmethod
    def check_model(cls, cfg: PEConfig, dims: ModelDims) -> None:
        """PosGPTError unless the scheme configured as ``cfg`` means what its name says in a model of ``dims``
        (checked at start-up with the config: a per-layer pattern needs its layers, a fraction of a head's
        dimensions must be a whole number of them)."""

    @classmethod
    def unread_settings(cls, cfg: PEConfig, dims: ModelDims) -> list[tuple[str, str]]:
        """(key under ``pe.``, one-line refusal) for each setting of ``cfg`` set to something but its default that
        the scheme does not read in a model of ``dims``, where that depends on more than a sibling setting (which
        core.domain's ``used_with`` declares): the run would equal one without it. Refused at start-up; an
        evaluation refuses those it sets itself."""
        return []

    # -- Evaluation-time variations, on configs (validation, labels, fine-tuning: no model is built) --

    @classmethod
    def check_variations(cls, cfg: PEConfig, specs: Sequence[str]) -> None:
        """PosGPTError unless the scheme's config and the ``eval.variations`` entries ``specs`` go together."""
        for spec in specs:
            cls.parse_variation(spec, cfg)

    @classmethod
    def parse_variation(cls, spec: str, cfg: PEConfig) -> dict[str, Any]:
        """One ``eval.variations`` entry -> the settings it applies (fields of ``eval_time_settings`` -> values),
        for a run configured as ``cfg``; PosGPTError when the entry means nothing to this scheme."""
        raise PosGPTError(f"eval.variations: pe={cls.name} has no evaluation-time variations (got {spec!r})")

    @classmethod
    def variation_label(cls, settings: dict[str, Any]) -> str:
        """A short name for ``settings`` (config objects, or the plain values result rows hold) in tables, plot
        legends and file names; "" when they vary nothing worth naming."""
        return ""

    @classmethod
    def inherit(cls, cfg: PEConfig, parent: PEConfig, parent_seq_len: int) -> PEConfig:
        """The scheme's config of a run that starts from the weights of a run configured as ``parent`` and
        trained at ``parent_seq_len`` (``train.init_from``): ``cfg`` with what it must take from the parent."""
        return cfg

    # -- ... and on the built scheme --

    def settings(self) -> dict[str, Any]:
        """The current values of ``eval_time_settings``."""
        return {name: getattr(self.cfg, name) for name in self.eval_time_settings}

    def current_variation(self) -> str:
        """The label of the scheme as it is now configured ("" when there is nothing to name)."""
        return self.variation_label(self.settings())

    def eval_variations(self, specs: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
        """``eval.variations`` entries -> a list of (label, settings), each setting once, for
        :meth:`evaluated_with`. Without specs: the run as configured, one entry."""
        variations = [self.parse_variation(spec, self.cfg) for spec in specs] or [self.settings()]
        return list({self.variation_label(settings): settings for settings in variations}.items())

    @contextlib.contextmanager
    def evaluated_with(self, settings: dict[str, Any]) -> Iterator[None]:
        """Apply eval-time settings (from ``eval_variations``) inside the block; the previous ones after it."""
        unknown = set(settings) - set(self.eval_time_settings)
        if unknown:
            raise PosGPTError(
                f"pe={self.name}: {sorted(unknown)} cannot change at evaluation time "
                f"(allowed: {list(self.eval_time_settings)})"
            )
        previous = {name: getattr(self.cfg, name) for name in settings}
        for name, value in settings.items():
            self.apply_eval_setting(name, value)
        try:
            yield
        finally:
            for name, value in previous.items():
                self.apply_eval_setting(name, value)

    def apply_eval_setting(self, name: str, value: Any) -> None:
        """Change one field of ``eval_time_settings`` on the built scheme."""
        raise NotImplementedError(f"positional scheme {self.name!r} has no evaluation-time setting {name!r}")

    def layer_schemes(self) -> list[tuple[PositionalEncoding, int]]:
        """The scheme each attention layer of the model runs, with that scheme's own index of the layer (which of
        its per-layer parameters it uses): this scheme in every layer, by default. A scheme composed of others
        per layer (hybrid.py) lists its parts; the model hands each layer its part (model/gpt.py)."""
        return [(self, layer) for layer in range(self.dims.n_layer)]

    def no_weight_decay(self) -> list[nn.Parameter]:
        """Parameters AdamW must not decay even though they are matrices (tables of biases, positions)."""
        return []

    def prepare(self, positions: torch.Tensor, seq_len: int, memo: dict) -> Any:
        """Per-forward values shared by all layers (RoPE's cos/sin), for queries at ``positions`` over
        ``seq_len`` keys. ``memo`` lives as long as a KV cache (one dict per generated sequence), for values
        that must stay fixed while decoding token by token."""
        return None

    def embed(self, positions: torch.Tensor) -> torch.Tensor | None:
        """(T,) integer positions -> (T, n_embd) vectors added to the token embeddings, or None."""
        return None

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, seq_len: int, prepared: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Transform the new q and k, both (B, H, T, D), at integer positions (T,) or (B, T); they may come back
        wider than D (the module docstring, "Wider q and k").

        ``seq_len`` is the number of keys attended to (cached ones included), for schemes that adapt to it;
        ``prepared`` is what ``prepare`` returned for this forward pass (computed here when None).
        """
        return q, k

    def score_window(self) -> int | None:
        """W when ``rotate`` returns a near and a far rotation (see "Scores merged by distance" above); None: one."""
        return None

    def rotation_depends_on_length(self) -> bool:
        """True when ``rotate`` depends on ``seq_len`` (dynamic NTK): a KV cache then keeps keys unrotated."""
        return False

    def score_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, head: torch.Tensor, layer: int) -> torch.Tensor:
        """A term added to the (pre-softmax, already scaled) attention score; elementwise, broadcastable."""
        raise NotImplementedError(f"positional scheme {self.name!r} has no score bias")

    def bias_block(self, q_pos: torch.Tensor, k_pos: torch.Tensor, layer: int) -> torch.Tensor:
        """(Tq,) or (B, Tq) query and (Tk,) or (B, Tk) key positions -> (H, Tq, Tk) or (B, H, Tq, Tk) biases."""
        heads = torch.arange(self.dims.n_head, device=q_pos.device)[:, None, None]
        return self.score_bias(q_pos[..., None, :, None], k_pos[..., None, None, :], heads, layer)

    def content_bias(self, q: torch.Tensor, scores: torch.Tensor, layer: int) -> torch.Tensor:
        """q (B, H, Tq, D) and the scaled, causally masked scores (B, H, Tq, Tk) -> a term added to them."""
        raise NotImplementedError(f"positional scheme {self.name!r} has no content bias")

    def attention_weights(self, scores: torch.Tensor, layer: int) -> torch.Tensor:
        """The scaled scores (B, H, Tq, Tk) of a block of queries over the keys, with the scheme's biases and -inf where
        the causal mask hides a key -> the weights, same shape, that multiply the values in place of softmax(scores)
        (module docstring, hook 6); float32 or wider, whatever the scores' dtype."""
        raise NotImplementedError(f"positional scheme {self.name!r} has no attention weights of its own")

    def cumulative_bias(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """The input of ``layer``'s attention, (B, T, C) -> the terms g, (B, H, T), whose cumulative sums c give
        the bias c_i - c_j of query i over key j (module docstring, hook 5)."""
        raise NotImplementedError(f"positional scheme {self.name!r} has no cumulative bias")

    def transitions(self, x: torch.Tensor, layer: int) -> Any:
        """The input of ``layer``'s attention, (B, T, C) -> the transitions T_t of its tokens, in whatever form
        ``transported_scores`` reads (module docstring, hook 7)."""
        raise NotImplementedError(f"positional scheme {self.name!r} has no transitions")

    def transported_scores(
        self, q: torch.Tensor, k: torch.Tensor, transitions: Any, carry: bool
    ) -> tuple[Callable[[int, int], torch.Tensor], torch.Tensor | None]:
        """The new queries q (B, H, Tq, D) and every key k (B, H, Tk, D), cached ones first (already carried through
        the transitions of every cached token after them), with the ``transitions`` of the Tq new tokens -> a function
        ``rows(start, stop)`` of the logits q_i . T_i ... T_{j+1} k_j of queries start..stop-1, (B, H, stop - start,
        Tk), unscaled and unmasked, float32 or wider (the written-out path calls it per block of queries); and with
        ``carry``, every key carried through the transitions of every token after it, (B, H, Tk, D), which the KV
        cache keeps (None without)."""
        raise NotImplementedError(f"positional scheme {self.name!r} has no transported scores")

    def fused_attention(self, device: torch.device) -> Callable[..., torch.Tensor] | None:
        """A kernel ``kernel(q, k, v, x, layer)`` -> the attention output (B, H, T, Dv) of a full causal pass of q, k,
        v (B, H, T, D) (q scaled by the model's attention temperature), with x (B, T, C) the layer's input, computing
        what the written-out path computes; None where no installed kernel applies on ``device`` (module docstring)."""
        return None

    def extra_repr(self) -> str:
        return f"name={self.name!r}"
