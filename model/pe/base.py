"""The base class of every positional scheme, and what position can do in a transformer.

Each place position can enter is a small interface (model/pe/capabilities.py) whose hooks a scheme writes; the scheme
inherits the interfaces it implements, and the base class alone is no position at all. The model reads the interfaces
once, when it is built, to choose each layer's attention kernel (model/kernels.py):

1. ``PositionEmbedding.embed(positions)`` -> a vector per position, added to the token embeddings
2. ``Rotation.rotate(q, k, positions, seq_len, prepared)`` -> q and k transformed in every attention layer
3. ``ScoreBias.score_bias(q_pos, k_pos, head, layer)`` -> a term added to attention scores
4. ``ModifiesAttention.attention_mods(x, q, k, layer, cache)`` -> what the scheme computes from the layer's input x (so
   from the data, per batch row and layer) and hands attention for this pass, an ``AttentionMods``: a term per (query,
   key) in the forms every kernel takes (``PairTerm``), a modification that sees the scaled, masked scores of a block
   of queries, the logits in place of q . k, or the weights in place of softmax; the last three run the written-out
   path, one block of queries at a time, so each must treat each query's row on its own. A KV cache hands the scheme
   its layer's slot (``CacheSlot``), where it keeps what its next step needs.
5. ``SlidingWindow.sliding_window()`` -> each query attends its W most recent keys alone

One more interface is not a place for position but a faster way to the same numbers: ``FusedKernel.fused_attention
(device)`` -> a kernel of model/kernels.py's signature that computes the scheme's whole attention in one pass, where an
installed package provides it (its reference's Triton kernel on a GPU), or None. The layer runs it for full causal
passes on ``device`` (training, scoring) and names it in the runs' records (``fused_backend``; ``fused_kernel`` says
which package's function it is, imported when the scheme is built); anything it cannot take (a KV cache, captured
probabilities, packed documents, a sink, a dtype outside ``fused_dtypes``) runs the written-out path.

``score_bias`` is written once as an elementwise function of broadcastable integer tensors. The attention
code turns it into a FlexAttention ``score_mod`` on GPU (scalar tensors per score) or a materialised bias
block on CPU (via ``bias_block``, which a scheme may override with a faster whole-block version); the
scheme never knows which.

Per forward pass. What does not depend on the layer (a rotation's cos/sin) is computed once by ``prepare`` and
handed to every layer in a :class:`PositionState`. A bias that depends only on the distance
(a ``DistanceBias``) is evaluated once per distance and forward pass (per layer for a ``LayerwiseBias``), by
``bias_block``; each block of queries is cut from that table, and FlexAttention's score_mod reads it
(model/attention.py). Schemes with per-layer parameters get ``ModelDims.n_layer`` and index them by ``layer``.

Per layer. The model asks the scheme which scheme runs each layer (``layer_schemes``): itself in every layer,
unless it is composed of others per layer (a pattern of schemes). Each layer then sees only its own scheme, with its
own prepared values and bias tables, and its own attention kernel.

Scores merged by distance. A scheme may score near and far pairs with different rotations (remapped distances):
``Rotation.score_window()`` then returns the window W, ``rotate`` returns q and k with the two rotations side by side
on the last dimension, (near, far), and attention takes q_near . k_near where 0 <= q_pos - k_pos
< W and q_far . k_far beyond (model/windowed_attention.py, on the written-out path).

Wider q and k. ``rotate`` may return q and k of another head size than v's (a scheme that maps each coordinate to
a complex number returns 2d real ones): attention scales their scores by 1 / sqrt(size of q) (scores merged by
distance, above, by 1 / sqrt(size of v)), so the scheme folds into q the scale it means, and the kernels pad v to
q's size (model/kernels.py), so the fused causal kernel still runs.

Positions are (T,) for every row, or (B, T) when each row has its own (randomized positions in training,
Ruoss et al. 2023); every hook accepts both.

Evaluation-time variations. A scheme may declare fields of its config that an evaluation may change without
changing what the trained weights compute (``eval_time_settings``; a rotation's context extension) and the entries
of ``eval.variations`` it understands. Everything about them is the scheme's: checking them with the config
(``check_variations``), parsing an entry (``parse_variation``), naming one in tables and files
(``variation_label``), applying one to the built model (``evaluated_with``), and what a run fine-tuned from
another inherits (``inherit``). Code outside ``model/pe/`` only calls these hooks and never names a scheme or
its settings (tests/house/test_house_rules.py).

Each scheme is a module in ``model/pe/`` that defines a subclass with ``name`` set and a config dataclass
(subclass of :class:`PEConfig`) in ``config_class``; ``model/pe/__init__.py`` discovers it, so adding a
scheme is one module plus one ``configs/pe/<name>.yaml``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from core.domain import check_domains
from core.errors import PosGPTError
from model.pe.capabilities import HOOKS, PositionEmbedding, Rotation, ScoreBias


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


class PositionalEncoding(nn.Module):
    """Base class: no position at all. Subclasses override the hooks they use."""

    name: ClassVar[str] = ""
    config_class: ClassVar[type[PEConfig]] = PEConfig
    # The scheme's own config fields that may change at evaluation/sampling time without changing what the
    # trained weights compute (a rotation's ("scaling",)).
    eval_time_settings: ClassVar[tuple[str, ...]] = ()

    def __init__(self, cfg: PEConfig, dims: ModelDims) -> None:
        super().__init__()
        check_domains(cfg, "pe.")  # the config's validation did this at start-up; model/ also runs without it
        self.cfg = cfg
        self.dims = dims
        # called after the scheme's settings change (an evaluation-time variation): the model resolves its layers'
        # attention paths again (model/gpt.py)
        self._settings_listeners: list[Callable[[], None]] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A scheme that writes a hook of an interface (model/pe/capabilities.py) inherits that interface: attention
        chooses its paths by the interfaces, so a hook written without one would never run."""
        super().__init_subclass__(**kwargs)
        for klass in cls.__mro__:
            if klass is PositionalEncoding or not issubclass(klass, PositionalEncoding):
                continue
            for hook in HOOKS.keys() & vars(klass).keys():
                if not issubclass(cls, HOOKS[hook]):
                    raise TypeError(f"{cls.__name__} writes {hook} without inheriting {HOOKS[hook].__name__}")

    @classmethod
    def uses_positions(cls) -> bool:
        """Whether the scheme has an interface that reads token positions (none of ModifiesAttention's do)."""
        return issubclass(cls, (PositionEmbedding, Rotation, ScoreBias))

    def max_positions(self) -> int | None:
        """The longest sequence this scheme can encode, or None when it is defined for any length."""
        return None

    def beyond_reach(self, length: int) -> str | None:
        """Why a window of ``length`` positions cannot be scored (a result row's ``reason``); None when it can."""
        limit = self.max_positions()
        return None if limit is None or length <= limit else f"pe={self.name} encodes at most {limit} positions"

    def check_random_positions(self, n_positions: int, setting: str = "train.random_positions") -> None:
        """PosGPTError unless training with positions drawn from [0, n_positions) makes sense for this scheme.
        ``setting``: the key that draws them, named in the refusal (train.random_positions, or PoSE's
        train.pose.target_len)."""
        if not self.uses_positions():
            raise PosGPTError(
                f"{setting}: pe={self.name} does not use token positions, so there is "
                f"nothing to randomize; drop {setting}"
            )
        limit = self.max_positions()
        if limit is not None and n_positions > limit:
            raise PosGPTError(
                f"{setting}={n_positions}: pe={self.name} encodes at most {limit} "
                f"positions (its table size); enlarge the table or lower {setting}"
            )

    @classmethod
    def check_settings(
        cls, cfg: PEConfig, dims: ModelDims, variations: Sequence[str], given: Callable[[str], bool]
    ) -> None:
        """Every start-up check of the scheme's settings, in a model of ``dims`` and with the ``eval.variations``
        entries ``variations``: a setting it would not read, among those ``given(key)`` says were set (a key under
        ``pe.``); then check_model and check_variations."""
        for key, message in cls.unread_settings(cfg, dims):
            if given(key):
                raise PosGPTError(message)
        cls.check_model(cfg, dims)
        cls.check_variations(cfg, variations)

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
        self.settings_changed()
        try:
            yield
        finally:
            for name, value in previous.items():
                self.apply_eval_setting(name, value)
            self.settings_changed()

    def on_settings_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` whenever the scheme's settings change on the built scheme (the model that holds it)."""
        self._settings_listeners.append(listener)

    def settings_changed(self) -> None:
        """Tell the listeners that a setting changed (what attention path a layer takes may have changed with it)."""
        for listener in self._settings_listeners:
            listener()

    def apply_eval_setting(self, name: str, value: Any) -> None:
        """Change one field of ``eval_time_settings`` on the built scheme."""
        raise NotImplementedError(f"positional scheme {self.name!r} has no evaluation-time setting {name!r}")

    def layer_schemes(self) -> list[tuple[PositionalEncoding, int]]:
        """The scheme each attention layer of the model runs, with that scheme's own index of the layer (which of
        its per-layer parameters it uses): this scheme in every layer, by default. A scheme composed of others
        per layer lists its parts; the model hands each layer its part (model/gpt.py)."""
        return [(self, layer) for layer in range(self.dims.n_layer)]

    def no_weight_decay(self) -> list[nn.Parameter]:
        """Parameters AdamW must not decay even though they are matrices (tables of biases, positions)."""
        return []

    def prepare(self, positions: torch.Tensor, seq_len: int, memo: dict) -> Any:
        """Per-forward values shared by all layers (a rotation's cos/sin), for queries at ``positions`` over
        ``seq_len`` keys. ``memo`` lives as long as a KV cache (one dict per generated sequence), for values
        that must stay fixed while decoding token by token."""
        return None

    def embed(self, positions: torch.Tensor) -> torch.Tensor | None:
        """No vectors added to the token embeddings (:class:`PositionEmbedding` adds some)."""
        return None

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, seq_len: int, prepared: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k as they are (:class:`Rotation` transforms them)."""
        return q, k

    def extra_repr(self) -> str:
        return f"name={self.name!r}"
