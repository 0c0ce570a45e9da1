"""A config section made from the frozen settings types of the stages that read it, each setting declared once.

A stage's settings type (a training stage's, training/settings.py; an evaluator's or the evaluation plan's,
evaluation/settings.py) is a frozen dataclass. Its fields with a default are the settings of the section it reads,
each declared there with its default, its domain and readers (core.domain's ``domain``, ``choice``, ``read_with``)
and its comment; a setting several stages read is declared once, in a small type they all inherit. Its fields
without a default are filled by whoever builds it from elsewhere (the planner; a plug-in evaluator's reading of a
setting another type declares).

:func:`schema_section` makes the schema's section (experiment/config.py) from those declarations: a plain
dataclass, not a frozen one, since OmegaConf makes a frozen dataclass's config read-only and Hydra merges the config
files and the command line into the schema. A frozen type holds a list setting as a tuple (``tuple[int, ...]``);
its section declares it as the list OmegaConf types (``list[int]``).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import types
import typing
from collections.abc import Sequence
from typing import Any


def declared_settings(kind: type) -> list[dataclasses.Field]:
    """The settings a stage's settings type declares: its fields with a default (its bases' first)."""
    return [
        item
        for item in dataclasses.fields(kind)
        if item.default is not dataclasses.MISSING or item.default_factory is not dataclasses.MISSING
    ]


def declaring_type(kind: type, name: str) -> type:
    """The class in ``kind``'s bases (or ``kind`` itself) whose own body declares field ``name``."""
    return next(base for base in kind.__mro__ if name in vars(base).get("__annotations__", {}))


def schema_type(hint: Any) -> Any:
    """The type a section declares for a setting a frozen type hints as ``hint``: a tuple of any length as the list
    of its element type (in a union too: ``tuple[int, ...] | None`` is ``list[int] | None``); others as they are."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return list[args[0]]
    if origin in (typing.Union, types.UnionType):
        return functools.reduce(operator.or_, [schema_type(arg) for arg in args])
    return hint


def schema_section(name: str, stages: Sequence[type], module: str, doc: str, key: str) -> type:
    """A dataclass named ``name`` (of module ``module``, where it is bound to that name) holding every setting the
    settings types ``stages`` declare, in their order, each once: one a stage inherits from a type it shares with
    others is the same declaration. A setting declared by two types is a TypeError at import; ``key`` is the
    section's key in the config (``train``, ``eval``), which that message names the setting by."""
    found: dict[str, tuple[type, dataclasses.Field]] = {}
    for stage in stages:
        for item in declared_settings(stage):
            owner, seen = found.setdefault(item.name, (stage, item))
            if seen is not item:
                raise TypeError(
                    f"{key}.{item.name} is declared by both {declaring_type(owner, item.name).__qualname__} and "
                    f"{declaring_type(stage, item.name).__qualname__}: declare it once, in a type both inherit"
                )
    fields = []
    for stage, item in found.values():
        kind = schema_type(typing.get_type_hints(stage)[item.name])  # resolved where the stage is declared
        copy = dataclasses.field(default=item.default, default_factory=item.default_factory, metadata=item.metadata)
        fields.append((item.name, kind, copy))
    section = dataclasses.make_dataclass(name, fields)
    section.__module__, section.__doc__ = module, doc  # so that pickle and OmegaConf's messages find it by name
    return section
