"""Per-layer patterns of schemes (hybrids): each attention layer runs its own scheme, the pattern cycled over the
layers,

    pe.pattern = [s_0, ..., s_(P-1)]   ->   layer l runs scheme s_(l mod P)

so ``pe=hybrid pe.pattern=[rope,rope,rope,none]`` puts RoPE in layers 0-2, NoPE in layer 3, RoPE in 4-6, and so on.
Each scheme of the pattern is built once, with its own settings under ``pe.<scheme>.*`` (``pe.rope.base=500000``:
the keys, types, domains and defaults of ``pe=<scheme>``), and with per-layer parameters only for the layers it
runs: FIRE's MLPs and KERPLE's and CoPE's tables count the scheme's own layers, layer l being the k-th layer of its
scheme. The model hands every layer its scheme (``layer_schemes``, model/pe/base.py), so each layer picks its own
attention path: with ALiBi in one layer of four, that layer adds its bias and the RoPE layers keep the fused causal
kernel. A pattern of one scheme, [s], is scheme s exactly: the same parameters, drawn from the same seed in the same
order, and the same logits.

What a pattern may hold: the schemes that act inside attention (they rotate q and k, or bias the scores). A scheme
that adds position vectors to the token embeddings (sinusoidal, learned) acts once, at the input, not in a layer,
so a pattern naming one is refused with one line, as is a pattern within a pattern. Every scheme a pattern may hold
has its settings in the config, used or not (``python train.py pe=hybrid --cfg job`` lists them); the run's
checkpoint records them all, and the per-layer schemes are printed in the run's first console line.

Presets (a config each in configs/pe/; the same machinery, other defaults):

- ``rnope``: RNoPE (Yang, Venkitesh, Talupuru, Lin, Cairuz, Blunsom & Locatelli 2025, "Rope to Nope and Back
  Again: A New Hybrid Attention Strategy", arXiv:2501.18795): NoPE and RoPE layers interleaved, one NoPE layer
  after three RoPE layers, [rope, rope, rope, none], RoPE with its usual base. The 3:1 layout is that of the
  paper's model in production, Cohere's Command A (its Hugging Face model card: "three layers with sliding window
  attention (window size 4096) and RoPE ... A fourth layer uses global attention without positional embeddings").
  The paper's long-context variant, RNoPE-SWA, also restricts the RoPE layers to a sliding window; posgpt does not
  model that: here every layer attends to the whole context.
- ``llama4_inope``: Llama 4's interleaved NoPE layers (Meta 2025, the "iRoPE" architecture): Hugging Face's
  ``Llama4TextConfig`` makes layer l a NoPE layer when (l + 1) % no_rope_layer_interval == 0 with the interval 4
  (``no_rope_layers = [1, 1, 1, 0] * 12``), the same [rope, rope, rope, none], and the released configs' RoPE
  layers use rope_theta = 500000 (``pe.rope.base``). Not modelled: the RoPE layers' chunked attention (8192
  tokens), their QK norm, and the NoPE layers' attention temperature.

A pattern longer than the model's layers runs its first entries, as Hugging Face's Llama 4 config does (its
2-layer models have no NoPE layer): rnope on posgpt's default 2-layer model would be [rope, rope], so it is refused
at start-up (a scheme of the pattern would never run; a model built directly warns); model.n_layer >= 4 runs it.

Evaluation-time variations act on the layers whose scheme has them: ``eval.variations=[yarn:16]`` rescales the
RoPE layers of rnope and leaves its NoPE layers as trained; one that no scheme of the pattern has is refused. Their
settings are the parts' own, named ``<scheme>.<setting>`` (``pe.rope.scaling``), and their labels the parts' labels.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from torch import nn

from core.errors import PosGPTError, warn
from model.pe import SCHEMES, build_positional_encoding
from model.pe.base import ModelDims, PEConfig, PositionalEncoding
from model.pe.capabilities import PositionEmbedding


@dataclass
class PatternConfig(PEConfig):
    """The fields of every per-layer pattern. Its config class (:func:`pattern_config`) adds one field per scheme a
    pattern may hold, named after the scheme, holding that scheme's settings."""

    name: str = "hybrid"
    # layer l runs pattern[l mod len]; schemes acting in attention only (not sinusoidal, learned)
    pattern: list[str] = field(default_factory=lambda: ["rope", "none"])

    def __post_init__(self) -> None:
        check_pattern(self)


def acts_in_layers(scheme: type[PositionalEncoding]) -> bool:
    """Whether ``scheme`` can run in some layers and not in others: it adds nothing to the input and is not itself
    a pattern."""
    return not issubclass(scheme, (PositionEmbedding, HybridPositionalEncoding))


def layer_scheme_names() -> list[str]:
    """The schemes a pattern may hold."""
    return sorted(name for name, scheme in SCHEMES.items() if acts_in_layers(scheme))


def check_pattern(cfg: PatternConfig) -> None:
    """PosGPTError (one line) unless every entry of the pattern names a scheme a pattern may hold, whose settings
    keep its name."""
    allowed = layer_scheme_names()
    if not cfg.pattern:
        raise PosGPTError(f"pe.pattern is empty: name the scheme of each layer (cycled), from {allowed}")
    for entry in cfg.pattern:
        if entry in allowed:
            continue
        if entry not in SCHEMES:
            raise PosGPTError(f"pe.pattern: unknown scheme {entry!r}; a pattern holds schemes among {allowed}")
        if issubclass(SCHEMES[entry], PositionEmbedding):
            raise PosGPTError(
                f"pe.pattern: {entry} adds position vectors to the token embeddings, once at the input, not in a "
                f"layer, so it cannot be one layer's scheme; a pattern holds schemes among {allowed}"
            )
        raise PosGPTError(f"pe.pattern: {entry} is itself a pattern; name its layers' schemes instead, from {allowed}")
    for name in allowed:
        if getattr(cfg, name).name != name:
            raise PosGPTError(f"pe.{name}.name={getattr(cfg, name).name!r}: the settings pe.{name}.* are {name}'s")


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested dict as {dotted key: value}."""
    flat = {}
    for key, value in tree.items():
        flat.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value})
    return flat


def _unread_message(cfg: PatternConfig, name: str, key: str, value: Any) -> str:
    return (
        f"pe.{name}.{key}={value} is read only when pe.pattern holds {name}; pe.pattern=[{','.join(cfg.pattern)}] "
        f"ignores it: drop it or add {name} to pe.pattern"
    )


def layer_names(cfg: PatternConfig, n_layer: int) -> list[str]:
    """The scheme of each of ``n_layer`` layers: the pattern cycled."""
    return [cfg.pattern[layer % len(cfg.pattern)] for layer in range(n_layer)]


def idle_schemes(cfg: PatternConfig, n_layer: int) -> list[str]:
    """The schemes of the pattern that no layer of ``n_layer`` runs."""
    return [name for name in dict.fromkeys(cfg.pattern) if name not in layer_names(cfg, n_layer)]


def idle_message(cfg: PatternConfig, n_layer: int) -> str:
    return (
        f"pe.pattern=[{','.join(cfg.pattern)}] over model.n_layer={n_layer} layers is "
        f"[{','.join(layer_names(cfg, n_layer))}]: {', '.join(idle_schemes(cfg, n_layer))} would never run; "
        f"use model.n_layer >= {len(cfg.pattern)}"
    )


@functools.cache
def pattern_config(owner: type[HybridPositionalEncoding]) -> type[PatternConfig]:
    """The config dataclass of the pattern scheme ``owner``: PatternConfig with owner's name and default pattern,
    and a field ``<scheme>`` per scheme a pattern may hold, defaulting to that scheme's defaults changed by
    ``owner.default_settings``. Made on first use, once the registry is complete."""

    def settings_of(name: str) -> Any:
        return functools.partial(SCHEMES[name].config_class, **owner.default_settings.get(name, {}))

    schemes = layer_scheme_names()
    fields = [
        ("name", str, field(default=owner.name)),
        ("pattern", list[str], field(default_factory=functools.partial(list, owner.default_pattern))),
        *[(name, SCHEMES[name].config_class, field(default_factory=settings_of(name))) for name in schemes],
    ]
    config = dataclasses.make_dataclass(f"{owner.__name__}Config", fields, bases=(PatternConfig,))
    config.__module__ = __name__
    globals()[config.__name__] = config  # importable by name, as pickle looks classes up
    return config


class _PerScheme:
    """A class attribute computed from the registry on first use (which schemes a pattern may hold is only known
    once every module of model/pe/ has been imported)."""

    def __init__(self, compute) -> None:
        self.compute = compute

    def __get__(self, obj: Any, owner: type) -> Any:
        return self.compute(owner)


def _eval_time_settings(owner: type) -> tuple[str, ...]:
    """``<scheme>.<setting>`` for each evaluation-time setting of each scheme a pattern may hold (``rope.scaling``)."""
    return tuple(f"{name}.{setting}" for name in layer_scheme_names() for setting in SCHEMES[name].eval_time_settings)


def _split(setting: str) -> tuple[str, str]:
    """``rope.scaling`` -> (``rope``, ``scaling``)."""
    scheme, _, name = setting.partition(".")
    return scheme, name


class HybridPositionalEncoding(PositionalEncoding):
    name = "hybrid"
    config_class = _PerScheme(pattern_config)
    eval_time_settings = _PerScheme(_eval_time_settings)
    # The preset: its default pattern, and the settings of its schemes that differ from their own defaults.
    default_pattern: ClassVar[tuple[str, ...]] = ("rope", "none")
    default_settings: ClassVar[dict[str, dict[str, Any]]] = {}

    def __init__(self, cfg: PatternConfig, dims: ModelDims) -> None:
        super().__init__(cfg, dims)
        check_pattern(cfg)
        per_layer = layer_names(cfg, dims.n_layer)
        if idle_schemes(cfg, dims.n_layer):  # refused at start-up (check_layers); a model built directly warns
            warn(idle_message(cfg, dims.n_layer))
        # Built in the order of their first layer, each with parameters for its own layers only.
        self.parts = nn.ModuleDict(
            {
                name: build_positional_encoding(getattr(cfg, name), replace(dims, n_layer=per_layer.count(name)))
                for name in dict.fromkeys(per_layer)
            }
        )
        self._layers = [(self.parts[name], per_layer[:layer].count(name)) for layer, name in enumerate(per_layer)]

    @classmethod
    def check_model(cls, cfg: PatternConfig, dims: ModelDims) -> None:
        if idle_schemes(cfg, dims.n_layer):  # a run named after a pattern must run it, not plain RoPE under its name
            raise PosGPTError(idle_message(cfg, dims.n_layer))
        per_layer = layer_names(cfg, dims.n_layer)
        for name in dict.fromkeys(cfg.pattern):  # each part in the model it runs in (p-RoPE's whole pairs)
            try:
                SCHEMES[name].check_model(getattr(cfg, name), replace(dims, n_layer=per_layer.count(name)))
            except PosGPTError as error:  # its settings are pe.<name>.*: say whose they are
                raise PosGPTError(f"pe.pattern's {name} (pe.{name}.*): {error}") from None

    @classmethod
    def unread_settings(cls, cfg: PatternConfig, dims: ModelDims) -> list[tuple[str, str]]:
        """The parts' own, and any setting of a scheme the pattern does not hold changed from its default: every
        scheme a pattern may hold has its settings in the config, but only those of the pattern are read."""
        unread = []
        for name in layer_scheme_names():
            settings = getattr(cfg, name)
            if name in cfg.pattern:
                part = SCHEMES[name].unread_settings(settings, dims)
                unread += [(f"{name}.{key}", message) for key, message in part]
                continue
            default = _flat(dataclasses.asdict(getattr(pattern_config(cls)(), name)))
            for key, value in _flat(dataclasses.asdict(settings)).items():
                if value != default.get(key):
                    unread.append((f"{name}.{key}", _unread_message(cfg, name, key, value)))
        return unread

    def layer_schemes(self) -> list[tuple[PositionalEncoding, int]]:
        return list(self._layers)

    def max_positions(self) -> int | None:
        limits = [part.max_positions() for part in self.parts.values()]
        limits = [limit for limit in limits if limit is not None]
        return min(limits) if limits else None

    def check_random_positions(self, n_positions: int, setting: str = "train.random_positions") -> None:
        users = [part for part in self.parts.values() if part.uses_positions()]
        if not users:
            raise PosGPTError(
                f"{setting}: no scheme of pe.pattern=[{','.join(self.cfg.pattern)}] uses token "
                f"positions, so there is nothing to randomize; drop {setting}"
            )
        for part in users:
            part.check_random_positions(n_positions, setting)

    def no_weight_decay(self) -> list[nn.Parameter]:
        return [p for part in self.parts.values() for p in part.no_weight_decay()]

    # -- Evaluation-time variations: those of the parts, each applied to its own layers --

    @classmethod
    def _understood(cls, spec: str, cfg: PatternConfig) -> dict[str, Any]:
        """The settings ``spec`` applies, ``<scheme>.<setting>`` -> value, over the schemes of the pattern that
        understand it."""
        settings = {}
        for name in dict.fromkeys(cfg.pattern):
            with contextlib.suppress(PosGPTError):
                part = SCHEMES[name].parse_variation(spec, getattr(cfg, name))
                settings.update({f"{name}.{setting}": value for setting, value in part.items()})
        return settings

    @classmethod
    def check_variations(cls, cfg: PatternConfig, specs: Sequence[str]) -> None:
        for spec in specs:
            cls.parse_variation(spec, cfg)
        for name in dict.fromkeys(cfg.pattern):
            understood = [spec for spec in specs if any(_split(s)[0] == name for s in cls._understood(spec, cfg))]
            SCHEMES[name].check_variations(getattr(cfg, name), understood)

    @classmethod
    def parse_variation(cls, spec: str, cfg: PatternConfig) -> dict[str, Any]:
        settings = cls._understood(spec, cfg)
        if not settings:
            raise PosGPTError(
                f"eval.variations: no scheme of pe={cls.name}'s pattern [{','.join(cfg.pattern)}] has an "
                f"evaluation-time variation {spec!r}"
            )
        return settings

    @classmethod
    def variation_label(cls, settings: dict[str, Any]) -> str:
        """The parts' labels, each once, joined by ``+`` (``yarn:16`` for rnope's RoPE layers)."""
        by_scheme: dict[str, dict[str, Any]] = {}
        for setting, value in settings.items():
            scheme, name = _split(setting)
            by_scheme.setdefault(scheme, {})[name] = value
        labels = [SCHEMES[scheme].variation_label(part) for scheme, part in by_scheme.items() if scheme in SCHEMES]
        return "+".join(dict.fromkeys(label for label in labels if label))

    @classmethod
    def inherit(cls, cfg: PatternConfig, parent: PatternConfig, parent_seq_len: int) -> PatternConfig:
        return dataclasses.replace(
            cfg,
            **{
                name: SCHEMES[name].inherit(getattr(cfg, name), getattr(parent, name), parent_seq_len)
                for name in dict.fromkeys(cfg.pattern)
            },
        )

    def settings(self) -> dict[str, Any]:
        parts = self.parts.items()
        return {f"{name}.{setting}": value for name, part in parts for setting, value in part.settings().items()}

    @contextlib.contextmanager
    def evaluated_with(self, settings: dict[str, Any]) -> Iterator[None]:
        unknown = [setting for setting in settings if _split(setting)[0] not in self.parts]
        if unknown:
            raise PosGPTError(f"pe={self.name}: {unknown} name no scheme of the pattern (it runs {list(self.parts)})")
        by_part: dict[str, dict[str, Any]] = {}
        for setting, value in settings.items():
            scheme, name = _split(setting)
            by_part.setdefault(scheme, {})[name] = value
        with contextlib.ExitStack() as stack:
            for scheme, part_settings in by_part.items():
                stack.enter_context(self.parts[scheme].evaluated_with(part_settings))
            yield

    def extra_repr(self) -> str:
        return f"name={self.name!r}, layers=[{','.join(part.name for part, _ in self._layers)}]"


class RNoPEPositionalEncoding(HybridPositionalEncoding):
    """RNoPE (Yang et al. 2025): three RoPE layers, then a NoPE layer (module docstring)."""

    name = "rnope"
    default_pattern = ("rope", "rope", "rope", "none")


class Llama4NoPEPositionalEncoding(HybridPositionalEncoding):
    """Llama 4's interleaved NoPE layers: every 4th layer NoPE, RoPE with base 500000 elsewhere (module docstring)."""

    name = "llama4_inope"
    default_pattern = ("rope", "rope", "rope", "none")
    default_settings = {"rope": {"base": 500000.0}}
