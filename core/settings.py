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

A type validates what it declares: one whose own body defines ``check(self)`` raises there, naming the setting, when
a value of the settings it declares cannot run (a training stage's: training/settings.py); what it needs of another
section is passed to it explicitly. :func:`check_declared_settings` runs every such check of a section's types, each
declaring type once, on the section's values: the planner runs those of the train section's types at its start.
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


def declared_checks(stages: Sequence[type]) -> list[type]:
    """The types among ``stages`` and their bases whose own body defines ``check``, each once: in the order of
    ``stages``, a stage's bases (in its method resolution order) before the stage itself."""
    found: dict[type, None] = {}
    for stage in stages:
        for kind in (*stage.__mro__[1:], stage):
            if "check" in vars(kind):
                found.setdefault(kind)
    return list(found)


def declared_part(kind: type, section: Any) -> Any:
    """An instance of the frozen settings type ``kind`` holding the settings it declares, each read by name from
    ``section`` (the schema's section, as its dataclass instance), a list as a tuple. Its fields without a default,
    what the planner works out and passes in (a model's FLOPs), are left unset, reading one an AttributeError: a
    section is checked before any of them is worked out, and a check reads only the settings its type declares."""
    settings = object.__new__(kind)  # not kind(...): that needs the fields without a default too
    for item in declared_settings(kind):
        value = getattr(section, item.name)
        object.__setattr__(settings, item.name, tuple(value) if isinstance(value, list) else value)
    return settings


def run_declared_checks(holders: dict[type, Any], *context: Any) -> None:
    """Every check the settings types of ``holders`` (stage type -> its settings) and their bases declare
    (:func:`declared_checks`), each declaring type once, run on the settings of the first stage that holds it with
    ``context`` (the evaluation's plan, for the eval section's types): PosGPTError from the first that refuses."""
    for kind in declared_checks(list(holders)):
        settings = next(held for stage, held in holders.items() if issubclass(stage, kind))
        kind.check(settings, *context)


def check_declared_settings(stages: Sequence[type], section: Any) -> None:
    """:func:`run_declared_checks` of the settings types ``stages``, each holding the settings it declares
    (:func:`declared_part`) read from ``section``."""
    run_declared_checks({stage: declared_part(stage, section) for stage in stages})
