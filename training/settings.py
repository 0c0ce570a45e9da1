"""The ``train.*`` settings: each declared once, in the settings type of the stage of training that reads it.

A stage's settings type (``LoopSettings``, ``OptimizerSettings``, ``CheckpointSettings``, ``MetricsSettings``,
``InitFromSettings``) is a frozen dataclass. Its fields with a default are the ``train.*`` settings the stage reads,
each declared there with its default, its domain and readers (core.domain's ``domain``, ``choice``, ``read_with``) and
its comment; its fields without one are what the planner hands it from other sections or works out
(experiment/plan.py, ``PASSED_IN``). A setting several stages read is declared once, in a small type they all inherit
(:class:`RunLength`: ``train.max_steps``).

The schema's ``train`` section (experiment/config.py, ``TrainConfig``) is made from those declarations by
:func:`schema_section`: a plain dataclass, not a frozen one, since OmegaConf makes a frozen dataclass's config
read-only and Hydra merges the config files and the command line into the schema. The planner fills each stage's
frozen settings from the composed section by field name (experiment/plan.py, ``section_settings``).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence

from core.domain import COMMANDS, domain

EVERY_COMMAND = tuple(COMMANDS)  # a setting every command reads (core.domain's commands)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunLength:
    """How long a run trains: the loop stops at ``train.max_steps``, the learning-rate schedule decays until it and
    the metrics' progress bar counts up to it."""

    max_steps: int = domain(1200, ge=1)  # optimizer steps


def declared_settings(kind: type) -> list[dataclasses.Field]:
    """The ``train.*`` settings a stage's settings type reads: its fields with a default (its bases' first)."""
    return [
        item
        for item in dataclasses.fields(kind)
        if item.default is not dataclasses.MISSING or item.default_factory is not dataclasses.MISSING
    ]


def declaring_type(kind: type, name: str) -> type:
    """The class in ``kind``'s bases (or ``kind`` itself) whose own body declares field ``name``."""
    return next(base for base in kind.__mro__ if name in vars(base).get("__annotations__", {}))


def schema_section(name: str, stages: Sequence[type], module: str, doc: str) -> type:
    """A dataclass named ``name`` (of module ``module``, where it is bound to that name) holding every setting the
    settings types ``stages`` declare, in their order, each once: one a stage inherits from a type it shares with
    others (RunLength) is the same declaration. A setting declared by two types is a TypeError at import."""
    found: dict[str, tuple[type, dataclasses.Field]] = {}
    for stage in stages:
        for item in declared_settings(stage):
            owner, seen = found.setdefault(item.name, (stage, item))
            if seen is not item:
                raise TypeError(
                    f"train.{item.name} is declared by both {declaring_type(owner, item.name).__qualname__} and "
                    f"{declaring_type(stage, item.name).__qualname__}: declare it once, in a type both inherit"
                )
    fields = []
    for stage, item in found.values():
        kind = typing.get_type_hints(stage)[item.name]  # resolved where the stage is declared
        copy = dataclasses.field(default=item.default, default_factory=item.default_factory, metadata=item.metadata)
        fields.append((item.name, kind, copy))
    section = dataclasses.make_dataclass(name, fields)
    section.__module__, section.__doc__ = module, doc  # so that pickle and OmegaConf's messages find it by name
    return section
