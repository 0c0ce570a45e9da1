"""Settings generated from what a config section's fields declare (core.domain): each declared choice, a flipped
switch, each numeric domain's edge, with the setting a field is read only beside (its used_with selector). The
property tests of the commands (tests/commands/) give these to the commands instead of a list of cases."""

from __future__ import annotations

import dataclasses
import typing

from core.domain import choices_of, domain_of, used_with
from model.pe import SCHEMES


def _values(field: dataclasses.Field, kind: typing.Any) -> list[str]:
    """Values of a setting away from its default, from what its field declares."""
    default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    choices, interval = choices_of(field), domain_of(field)
    listed = _listed(kind)
    if choices:
        return [f"[{c}]" if listed else str(c) for c in choices if c != default and [c] != default]
    if kind is bool:
        return [str(not default).lower()]
    if interval is None:
        return []
    whole = "int" in str(kind)
    low = interval.ge if interval.ge is not None else None
    if low is None and interval.gt is not None:
        low = interval.gt + (1 if whole else 0.5)
    values = [v for v in (low,) if v is not None and v in interval]  # the edge of its domain, the likeliest to break
    return [f"[{v}]" if listed else str(v) for v in values]


def _selector(field: dataclasses.Field, kinds: dict[str, typing.Any], prefix: str) -> list[str]:
    """The setting that a field read only with another's value (core.domain's used_with) needs beside it."""
    declared = used_with(field)
    if declared is None:
        return []
    selector, values = declared
    value = values[0]
    if kinds[selector] is bool:
        return [f"{prefix}{selector}={str(value).lower()}"]
    return [f"{prefix}{selector}=[{value}]" if _listed(kinds[selector]) else f"{prefix}{selector}={value}"]


def _listed(kind: typing.Any) -> bool:
    """Whether a setting of type ``kind`` is typed as a list (a schema's list, a settings type's tuple, either
    optional)."""
    return any(typing.get_origin(one) in (list, tuple) for one in (kind, *typing.get_args(kind)))


def generated_settings(section: type, prefix: str) -> list[tuple[str, ...]]:
    """Every generated setting of the section type ``section`` (its keys under ``prefix``, e.g. ``eval.``): each a
    tuple of overrides, its selector first where it has one."""
    kinds = typing.get_type_hints(section)
    return [
        (*_selector(field, kinds, prefix), f"{prefix}{field.name}={value}")
        for field in dataclasses.fields(section)
        for value in _values(field, kinds[field.name])
    ]


# What a command's test gives beside a generated setting to keep the work it starts small: the copy probe scores
# ceil(z² / 4h²) examples a length (385 at the default eval.task_half_width); a few run it to its end as well.
# The probe is asked for by its switch (eval.tasks) or by name (eval.evaluators).
SMALL_WORK = {f"eval.{key}=[copy_probe]": "eval.task_half_width=0.3" for key in ("tasks", "evaluators")}


def kept_small(setting: tuple[str, ...]) -> tuple[str, ...]:
    """``setting`` with what SMALL_WORK gives beside its overrides, unless the setting gives that key itself."""
    given = {override.split("=", 1)[0] for override in setting}
    extra = [SMALL_WORK[o] for o in setting if o in SMALL_WORK and SMALL_WORK[o].split("=", 1)[0] not in given]
    return (*extra, *setting)


def eval_time_settings(pe_name: str) -> list[tuple[str, ...]]:
    """The generated settings of each evaluation-time setting the scheme ``pe_name`` declares (its
    ``eval_time_settings``, under ``pe.``): a section's (``pe.rope.scaling.*`` of a hybrid) each of its fields, a
    single setting (``pe.scaled_nope.score_scaling``) itself."""
    generated = []
    for setting in SCHEMES[pe_name].eval_time_settings:
        *path, name = setting.split(".")
        owner = SCHEMES[pe_name].config_class
        for part in path:  # the dataclass that holds the setting
            owner = typing.get_type_hints(owner)[part]
        kind = typing.get_type_hints(owner)[name]
        if dataclasses.is_dataclass(kind):
            generated += generated_settings(kind, f"pe.{setting}.")
        else:
            parent = "".join(f"{part}." for part in path)
            own = generated_settings(owner, f"pe.{parent}")
            generated += [one for one in own if one[-1].startswith(f"pe.{setting}=")]
    return generated
