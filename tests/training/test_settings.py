"""Each train.* settings type validates the settings it declares (training/settings.py, its ``check``), and the
planner runs every check of the train section's types, each declaring type once: the cases are generated from the
types of experiment/config.py's TRAIN_STAGES. A value each check refuses is found from its type (a choice it
declares, a bound of a domain, a large number, another word), with the rest of the section at its defaults, and must
reach the user as that refusal, word for word, through validate and the planner of train.py."""

import dataclasses
import typing
from collections.abc import Iterator
from typing import Any

import pytest
from omegaconf import OmegaConf

from core.domain import as_typed, choices_of, domain_of
from core.errors import PosGPTError
from core.settings import check_declared_settings, declared_checks, declared_part, declared_settings, declaring_type
from experiment.compose import compose_config
from experiment.config import TRAIN_STAGES, TrainConfig, validate
from experiment.plan import plan_training

DECLARING = sorted(
    {kind for stage in TRAIN_STAGES for kind in stage.__mro__ if "check" in vars(kind)}, key=lambda kind: kind.__name__
)
LARGE = 10**6  # past any bound a setting's check holds it to, and inside every domain without an upper bound


def _default(item: dataclasses.Field) -> Any:
    return item.default_factory() if item.default_factory is not dataclasses.MISSING else item.default


def _values(item: dataclasses.Field, hint: Any, default: Any) -> list[Any]:
    """The values of a setting its declaration suggests, other than its default: its choices, its domain's
    bounds and a large number inside it, the other truth value, another word, None where it may be None."""
    kinds = [arg for arg in typing.get_args(hint) if arg is not type(None)] or [hint]
    (kind,) = kinds
    found: list[Any] = list(choices_of(item) or ())
    interval = domain_of(item)
    if interval is not None and kind in (int, float):
        found += [kind(bound) for bound in (interval.ge, interval.le) if bound is not None]
        found += [kind(interval.gt + 1)] if interval.gt is not None and interval.lt is None else []
        found += [kind(LARGE)] if interval.le is None and interval.lt is None else []
    elif kind is bool:
        found.append(not default)
    elif kind is str and choices_of(item) is None:
        found.append(f"not-{default}")
    if type(None) in typing.get_args(hint) and default is not None:
        found.append(None)
    return [value for value in dict.fromkeys(found) if value != default]


def _changed(kind: type, prefix: str = "") -> Iterator[tuple[str, Any, dict[str, Any]]]:
    """(dotted key under train, value, the fields of ``kind`` to replace) for one setting of ``kind`` changed at a
    time: each setting ``kind`` declares (its bases' too), and each setting of a nested section (train.pose)."""
    items = declared_settings(kind) if not prefix else dataclasses.fields(kind)
    for item in items:
        default, hint = _default(item), typing.get_type_hints(declaring_type(kind, item.name))[item.name]
        if dataclasses.is_dataclass(default):
            for key, value, nested in _changed(type(default), f"{prefix}{item.name}."):
                yield key, value, {item.name: dataclasses.replace(default, **nested)}
            continue
        for value in _values(item, hint, default):
            yield f"{prefix}{item.name}", value, {item.name: value}


def refusals(kind: type) -> list[tuple[str, str]]:
    """(override, refusal) for each value of one setting that ``kind``'s check refuses, the train section otherwise
    at its defaults."""
    found = []
    for key, value, fields in _changed(kind):
        section = dataclasses.replace(TrainConfig(), **fields)
        try:
            kind.check(declared_part(kind, section))
        except PosGPTError as refused:
            shown = "null" if value is None else as_typed(value)
            found.append((f"train.{key}={shown}", str(refused)))
    return found


REFUSALS = [(kind, override, message) for kind in DECLARING for override, message in refusals(kind)]


def test_the_train_section_has_checks_to_run():
    assert len(DECLARING) >= 3


@pytest.mark.parametrize("kind", DECLARING, ids=[kind.__name__ for kind in DECLARING])
def test_every_check_a_train_settings_type_declares_refuses_a_value_found_from_the_type(kind):
    assert refusals(kind), f"no single train.* value found from {kind.__name__} is refused by its check"


@pytest.mark.parametrize("kind", DECLARING, ids=[kind.__name__ for kind in DECLARING])
def test_every_check_a_train_settings_type_declares_is_run_once_by_the_planner(kind, monkeypatch):
    calls = []
    for declaring in DECLARING:
        monkeypatch.setattr(declaring, "check", lambda self, declaring=declaring: calls.append((declaring, self)))
    cfg = compose_config(["train.seq_len=32", "train.lr=0.002", "train.pose.chunks=3"])
    validate(cfg)
    assert [declaring for declaring, _ in calls] == declared_checks(TRAIN_STAGES)
    (settings,) = [held for declaring, held in calls if declaring is kind]  # the section's values, by name
    section = OmegaConf.to_object(cfg.train)
    assert all(getattr(settings, item.name) == getattr(section, item.name) for item in declared_settings(kind))


@pytest.mark.parametrize(
    "kind, override, message", REFUSALS, ids=[f"{kind.__name__}:{override}" for kind, override, _ in REFUSALS]
)
def test_a_value_a_check_refuses_reaches_the_user_as_its_refusal(kind, override, message, tmp_path):
    with pytest.raises(PosGPTError) as refused:
        validate(compose_config([override]))
    assert str(refused.value) == message
    run_dir = tmp_path / "run"
    with pytest.raises(PosGPTError) as planned:
        plan_training(compose_config([override]), [override], run_dir)
    assert str(planned.value) == message and not run_dir.exists()


def test_a_check_reads_its_declared_settings_and_not_what_the_planner_passes_in():
    calls = []

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Shared:
        a: int = 0

        def check(self) -> None:
            calls.append(("Shared", type(self).__name__, self.a))

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Stage(Shared):
        b: int = 0
        passed: float  # worked out by the planner after the section is checked

        def check(self) -> None:
            calls.append(("Stage", self.b))
            calls.append(self.passed)

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Other(Shared):
        c: list[int] = dataclasses.field(default_factory=list)

        def check(self) -> None:
            calls.append(("Other", self.c))

    @dataclasses.dataclass
    class Section:
        a: int = 1
        b: int = 2
        c: list[int] = dataclasses.field(default_factory=lambda: [3])

    with pytest.raises(AttributeError, match="passed"):
        check_declared_settings([Stage, Other], Section())
    assert calls == [("Shared", "Stage", 1), ("Stage", 2)]
    calls.clear()
    check_declared_settings([Other, Shared], Section())
    assert calls == [("Shared", "Other", 1), ("Other", (3,))]  # a list setting as the frozen type's tuple
