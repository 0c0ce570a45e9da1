"""A config section made from stages' frozen settings types declares each setting once (core/settings.py). The cases
are generated from the sections the schema makes this way (train, eval) and their stages' types."""

import dataclasses
import typing

import pytest

from core.settings import declared_settings, declaring_type, schema_section, schema_type
from experiment.config import EVAL_STAGES, TRAIN_STAGES, EvalConfig, TrainConfig

SECTIONS = {"train": (TrainConfig, TRAIN_STAGES), "eval": (EvalConfig, EVAL_STAGES)}
SETTINGS = [(key, item.name) for key, (section, _) in SECTIONS.items() for item in dataclasses.fields(section)]


def _declarations(stages: tuple[type, ...], name: str) -> set[type]:
    """The types (a stage's settings type, or a base it shares with others) whose own body declares ``name``."""
    return {declaring_type(stage, name) for stage in stages if name in {f.name for f in declared_settings(stage)}}


@pytest.mark.parametrize("key, name", SETTINGS, ids=[f"{key}.{name}" for key, name in SETTINGS])
def test_every_setting_of_a_made_section_is_declared_by_exactly_one_type(key, name):
    section, stages = SECTIONS[key]
    (owner,) = _declarations(stages, name)
    declared = {item.name: item for item in dataclasses.fields(owner)}[name]
    schema = {item.name: item for item in dataclasses.fields(section)}[name]
    assert (schema.default, schema.metadata) == (declared.default, declared.metadata)
    if declared.default_factory is not dataclasses.MISSING:
        assert schema.default_factory() == declared.default_factory()
    assert typing.get_type_hints(section)[name] == schema_type(typing.get_type_hints(owner)[name])


@pytest.mark.parametrize("key", SECTIONS)
def test_a_sections_stages_are_frozen_and_the_section_is_not(key):
    section, stages = SECTIONS[key]
    assert all(stage.__dataclass_params__.frozen for stage in stages)
    assert not section.__dataclass_params__.frozen  # Hydra merges the config files and the command line into it


@pytest.mark.parametrize("key", SECTIONS)
def test_a_setting_declared_by_two_types_is_refused(key):
    @dataclasses.dataclass(frozen=True)
    class One:
        lr: float = 1.0

    @dataclasses.dataclass(frozen=True)
    class Other:
        lr: float = 2.0

    with pytest.raises(TypeError, match=rf"{key}\.lr is declared by both .*One and .*Other"):
        schema_section("Section", (One, Other), __name__, "", key)


def test_a_frozen_types_tuple_setting_is_a_list_in_the_schema():
    assert schema_type(tuple[int, ...]) == list[int]
    assert schema_type(tuple[float, ...] | None) == list[float] | None
    assert schema_type(tuple[int, int]) == tuple[int, int]  # a fixed-length tuple is not a list setting
