"""The domain of a numeric setting, declared once in its schema next to its type, and checked at start-up.

A config dataclass declares a numeric field with :func:`domain` instead of a bare default::

    beta1: float = domain(0.9, ge=0, lt=1)
    lengths: list[int] | None = domain(None, ge=1)  # a list: each element; None is always allowed
    beta_fast: float = domain(32.0, gt=0, used_with=("type", ("yarn",)))  # read only when type is yarn
    dtype: str = choice("auto", ("auto", "float32", "bfloat16"))  # one of a few words

and :func:`check_domains` walks a config (nested dataclass instances, e.g. ``OmegaConf.to_object`` of a
composed config) and raises PosGPTError naming the first value outside its field's domain, e.g.
``train.beta1=1.5 is out of its domain [0, 1)``. A field declared ``used_with=(selector, values)`` is read only
when its sibling field ``selector`` is one of ``values`` (or, for a list, holds one): :func:`check_used` refuses it
set to anything but its default otherwise, since the run would silently ignore it (:func:`read_with` declares
that alone, for a field of any type). A field declared ``runs=(kind, ...)`` is read only by runs of those kinds
(``"text"``: a language-model run; ``"task"``: a run of a synthetic task): :func:`check_run_kind` refuses it set
to anything but its default in a run of another kind. A field declared ``commands=(command, ...)`` is read only by
those commands (COMMANDS): :func:`readers_of` answers who reads a dotted key. A section of the schema declares
``commands`` and ``runs`` once for all its fields (:func:`section`); a field's own declaration replaces its section's.
Other checks that relate several keys stay code beside the schema.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

from core.errors import PosGPTError

_KEY = "domain"  # the metadata key of a dataclass field that holds its Interval
_OWNER = "used_with"  # the metadata key of a field's (selector, values): the settings that read it
_RUNS = "runs"  # the metadata key of a field's kinds of run that read it
_COMMANDS = "commands"  # the metadata key of a field's commands that read it
_CHOICES = "choices"  # the metadata key of a field's values, where it takes one of a few
_NONEMPTY = "nonempty"  # the metadata key of a list field that must name at least one value
RUN_KINDS = {"text": "a language-model run", "task": "a task run"}
# The commands that read a config, by the name a declaration gives them, and the script each is.
COMMANDS = {
    "train": "train.py",
    "eval": "eval.py",
    "sample": "sample.py",
    "inspect": "scripts/inspect_attention.py",
    "speed": "scripts/speed.py",  # a training step's and a forward pass's speed, on random token ids
    "estimate": "scripts/estimate.py",  # their memory and FLOPs, predicted (experiment/estimate.py)
}
# scripts/speed.py and scripts/estimate.py: a training step and a forward pass of the model on random token ids, so
# what those read of train.* and model.*, and the evaluation's batch, but no data, task, logging or other eval.*
BENCHMARKS = ("speed", "estimate")


def _bound(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Interval:
    """The finite numbers x with ge <= x, gt < x, x <= le and x < lt (the bounds given); never inf or nan."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def __contains__(self, value: float) -> bool:
        return (
            math.isfinite(value)
            and (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
        )

    def __str__(self) -> str:
        low = "(-inf" if self.gt is None else f"({_bound(self.gt)}"
        high = "inf)" if self.lt is None else f"{_bound(self.lt)})"
        if self.ge is not None:
            low = f"[{_bound(self.ge)}"
        if self.le is not None:
            high = f"{_bound(self.le)}]"
        return f"{low}, {high}"


def domain(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Any = dataclasses.MISSING,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    used_with: tuple[str, tuple[Any, ...]] | None = None,
    runs: tuple[str, ...] | None = None,
    commands: tuple[str, ...] | None = None,
    nonempty: bool = False,
) -> Any:
    """A dataclass field (``dataclasses.field``) whose values must lie in the interval the bounds describe, and,
    with ``used_with=(selector, values)``, that only those values of its sibling ``selector`` read; with ``runs``,
    that only runs of those kinds read (RUN_KINDS); with ``commands``, that only those commands read (COMMANDS);
    with ``nonempty``, a list that must name at least one value."""
    metadata = {_KEY: Interval(ge=ge, gt=gt, le=le, lt=lt), **_readers(used_with, runs, commands)}
    metadata |= {_NONEMPTY: True} if nonempty else {}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def read_with(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Any = dataclasses.MISSING,
    used_with: tuple[str, tuple[Any, ...]] | None = None,
    runs: tuple[str, ...] | None = None,
    commands: tuple[str, ...] | None = None,
    choices: Collection[Any] | None = None,
    nonempty: bool = False,
) -> Any:
    """A dataclass field of any type (no numeric domain) that only the given values of its sibling read, or only
    runs of the given kinds, or only the given commands, as :func:`domain`'s ``used_with``, ``runs`` and
    ``commands``; with ``choices``, it takes one of those values (:func:`choice`); ``nonempty`` as domain's."""
    metadata = _readers(used_with, runs, commands)
    metadata |= {_NONEMPTY: True} if nonempty else {}
    if choices is not None:
        metadata[_CHOICES] = tuple(choices)
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def choice(default: Any, choices: Collection[Any], **readers: Any) -> Any:
    """A dataclass field that takes one of ``choices`` (a word of a few, such as ``train.dtype``'s), or with a list
    ``default`` a list of them, checked by :func:`check_domains` with the other domains; ``readers`` as
    :func:`read_with`'s."""
    values = default if isinstance(default, list) else [default]
    if any(value not in choices for value in values):
        raise ValueError(f"the default {default!r} is not one of its choices {list(choices)}")
    if isinstance(default, list):  # a list of them: each element one of the choices
        return read_with(default_factory=lambda: list(default), choices=choices, **readers)
    return read_with(default, choices=choices, **readers)


def is_nonempty(field: dataclasses.Field) -> bool:
    """Whether a list field must name at least one value (:func:`domain`'s ``nonempty``)."""
    return bool(field.metadata.get(_NONEMPTY))


def choices_of(field: dataclasses.Field) -> tuple[Any, ...] | None:
    """The values a field takes, where it declares them (:func:`choice`), or None."""
    return field.metadata.get(_CHOICES)


def section(
    default_factory: Any = dataclasses.MISSING,
    *,
    default: Any = dataclasses.MISSING,
    runs: tuple[str, ...] | None = None,
    commands: tuple[str, ...] | None = None,
) -> Any:
    """A field holding a section of settings (a nested dataclass) whose fields only runs of kinds ``runs`` and the
    commands ``commands`` read, unless a field declares its own."""
    metadata = _readers(None, runs, commands)
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def _readers(
    used_with: tuple[str, tuple[Any, ...]] | None, runs: tuple[str, ...] | None, commands: tuple[str, ...] | None
) -> dict[str, Any]:
    """A field's metadata for what reads it; a kind of run or a command the project does not have is a
    ValueError when the schema is imported."""
    for given, known, what in ((runs, RUN_KINDS, "kinds of run"), (commands, COMMANDS, "commands")):
        if given is not None and set(given) - set(known):
            raise ValueError(f"unknown {what} {sorted(set(given) - set(known))}; they are {list(known)}")
    named = {_OWNER: used_with, _RUNS: runs, _COMMANDS: commands}
    return {key: tuple(value) if key != _OWNER else value for key, value in named.items() if value is not None}


@dataclass(frozen=True)
class Readers:
    """Who reads a setting: the commands (names of COMMANDS) and the kinds of run (None: every kind)."""

    commands: tuple[str, ...]
    runs: tuple[str, ...] | None

    def __or__(self, other: Readers) -> Readers:
        """Who reads either of two settings (a whole section's readers: any of its fields')."""
        runs = None if self.runs is None or other.runs is None else (*self.runs, *other.runs)
        commands = {*self.commands, *other.commands}
        return Readers(tuple(c for c in COMMANDS if c in commands), runs and tuple(k for k in RUN_KINDS if k in runs))


EVERYONE = Readers(tuple(COMMANDS), None)


@dataclass(frozen=True)
class Leaf:
    """A setting of a config dataclass instance: its dotted key, its field, its value and who reads it."""

    key: str
    field: dataclasses.Field
    value: Any
    readers: Readers

    @property
    def given(self) -> bool:
        """Whether the value is anything but the field's default."""
        return self.value != _default(self.field)


def leaves(config: Any, prefix: str = "", readers: Readers = EVERYONE) -> Iterator[Leaf]:
    """Every setting of a config dataclass instance (nested ones walked), each with the readers its own field
    declares, or else the nearest section above it declares (``readers``: the section's own)."""
    for field in dataclasses.fields(config):
        here = Readers(field.metadata.get(_COMMANDS, readers.commands), field.metadata.get(_RUNS, readers.runs))
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            yield from leaves(value, prefix + field.name + ".", here)
        else:
            yield Leaf(prefix + field.name, field, value, here)


def changed_keys(config: Any) -> list[str]:
    """The dotted keys of a config dataclass instance's settings that are anything but their default."""
    return [leaf.key for leaf in leaves(config) if leaf.given]


def readers_of(config: Any, key: str) -> Readers | None:
    """Who reads dotted ``key`` of a config dataclass instance: its field's readers, or for a section (a group such
    as ``data``) anyone who reads one of its fields, or for a key inside a plain dict setting that setting's; None
    for a key the config does not have."""
    found = [leaf.readers for leaf in leaves(config) if is_set(leaf.key, [key]) or is_set(key, [leaf.key])]
    return functools.reduce(operator.or_, found) if found else None


def check_run_kind(config: Any, kind: str, what: str, keys: Collection[str] | None = None) -> None:
    """PosGPTError naming the first setting of a config dataclass instance set to something but its default that
    runs of ``kind`` never read (``runs``, its own or its section's): the run would equal one without it. ``what``:
    the run in words (``task=passkey``); ``keys``: check only these dotted keys and those under them (None: all)."""
    for leaf in leaves(config):
        kinds = leaf.readers.runs
        if kinds is None or kind in kinds or not leaf.given or not is_set(leaf.key, keys):
            continue
        readers = " or ".join(RUN_KINDS[reader] for reader in kinds)
        raise PosGPTError(
            f"{leaf.key}={as_typed(leaf.value)} is read only by {readers}; this is {RUN_KINDS[kind]} ({what}): drop it"
        )


def domain_of(field: dataclasses.Field) -> Interval | None:
    """The domain a field declares, or None."""
    return field.metadata.get(_KEY)


def used_with(field: dataclasses.Field) -> tuple[str, tuple[Any, ...]] | None:
    """(selector, values) of a field read only under those values of its sibling ``selector``, or None."""
    return field.metadata.get(_OWNER)


def _default(field: dataclasses.Field) -> Any:
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default


def is_set(key: str, keys: Collection[str] | None) -> bool:
    """Whether dotted ``key`` is, or lies under, one of ``keys`` (None: every key)."""
    return keys is None or any(key == name or key.startswith(name + ".") for name in keys)


def check_used(
    config: Any,
    prefix: str = "",
    also: frozenset[str] = frozenset(),
    keys: Collection[str] | None = None,
    read: Collection[str] = (),
) -> None:
    """PosGPTError naming the first field of a config dataclass instance (nested ones included) that is set to
    something but its default while its selector does not read it (``used_with``): ignored, it would change
    nothing. ``also``: selector values in use elsewhere (eval.variations' types, which read the settings of a
    scheme configured without one). ``keys``: check only these dotted keys and those under them (an evaluation's
    overrides: a trained setting that its override leaves unread was read in training); None: all. ``read``: dotted
    keys read whatever their selector holds (the settings of an evaluator that eval.evaluators names)."""
    for field in dataclasses.fields(config):
        value, key = getattr(config, field.name), prefix + field.name
        if dataclasses.is_dataclass(value):
            check_used(value, key + ".", also, keys, read)
            continue
        owner = used_with(field)
        if owner is None or value == _default(field) or not is_set(key, keys) or key in read:
            continue
        selector, users = owner
        chosen = getattr(config, selector)
        if ((set(chosen) if isinstance(chosen, list) else {chosen}) | also) & set(users):
            continue
        name = prefix + selector
        users = [str(user).lower() if isinstance(user, bool) else str(user) for user in users]  # true, as typed
        wanted = f"{name} holds {' or '.join(users)}" if isinstance(chosen, list) else f"{name}={'|'.join(users)}"
        shown = as_typed(chosen)
        value = str(value).lower() if isinstance(value, bool) else value  # true, as typed
        raise PosGPTError(
            f"{key}={value} is read only when {wanted}; {name}={shown} ignores it: drop it or change {name}"
        )


def as_typed(value: Any) -> Any:
    """A setting's value as a user types it in an override: a list as [a,b], a bool as true or false."""
    shown = f"[{','.join(map(str, value))}]" if isinstance(value, list) else value
    return str(shown).lower() if isinstance(shown, bool) else shown


def _check_choices(key: str, value: Any, choices: tuple[Any, ...]) -> None:
    items = [(f"{key}[{i}]", v) for i, v in enumerate(value)] if isinstance(value, list) else [(key, value)]
    for name, item in items:
        if item not in choices:
            raise PosGPTError(f"{name}={item!r} is not one of its choices: {', '.join(map(str, choices))}")


def check_domains(config: Any, prefix: str = "") -> None:
    """PosGPTError naming the first value of a config dataclass instance (nested ones included) outside its
    field's domain: ``<prefix><key>=<value> is out of its domain <interval>``, a list's element as
    ``<key>[i]=<value>``, or not one of its field's choices, or an empty list where the field declares it
    ``nonempty``. None values pass a domain: the schema's types say where None is allowed."""
    for field in dataclasses.fields(config):
        value, key = getattr(config, field.name), prefix + field.name
        if dataclasses.is_dataclass(value):
            check_domains(value, key + ".")
            continue
        if is_nonempty(field) and isinstance(value, list) and not value:
            raise PosGPTError(f"{key}=[] names nothing: it must name at least one value")
        choices = choices_of(field)
        if choices is not None:
            _check_choices(key, value, choices)
        interval = domain_of(field)
        if interval is None or value is None:
            continue
        items = [(f"{key}[{i}]", v) for i, v in enumerate(value)] if isinstance(value, list) else [(key, value)]
        for name, item in items:
            if item not in interval:
                raise PosGPTError(f"{name}={item} is out of its domain {interval}")
