"""Each train.* setting is declared once, in the settings type of the stage that reads it (training/settings.py): the
schema's train section is made from those types, and a stage's settings hold nothing else but what the planner
passes in from other sections (experiment/plan.py, PASSED_IN). The cases are generated from the types."""

import dataclasses

import pytest
from omegaconf import OmegaConf

from experiment.config import TRAIN_STAGES, TrainConfig
from experiment.plan import PASSED_IN, section_settings
from training.optim import OptimizerSettings
from training.settings import declared_settings, declaring_type, schema_section

SCHEMA_FIELDS = {item.name: item for item in dataclasses.fields(TrainConfig)}
STAGE_FIELDS = [(stage, item) for stage in TRAIN_STAGES for item in dataclasses.fields(stage)]


def _declarations(name: str) -> set[type]:
    """The types (a stage's settings type, or a base it shares with others) whose own body declares ``name`` as a
    train.* setting."""
    return {
        declaring_type(stage, name)
        for stage in TRAIN_STAGES
        if name in {item.name for item in declared_settings(stage)}
    }


@pytest.mark.parametrize("name", sorted(SCHEMA_FIELDS))
def test_every_train_setting_is_declared_by_exactly_one_type(name):
    (owner,) = _declarations(name)
    declared = {item.name: item for item in dataclasses.fields(owner)}[name]
    schema = SCHEMA_FIELDS[name]
    assert (schema.default, schema.metadata) == (declared.default, declared.metadata)
    if declared.default_factory is not dataclasses.MISSING:
        assert schema.default_factory() == declared.default_factory()


@pytest.mark.parametrize("stage, item", STAGE_FIELDS, ids=[f"{s.__name__}.{f.name}" for s, f in STAGE_FIELDS])
def test_every_field_of_a_stage_is_its_schema_setting_or_passed_in(stage, item):
    passed = item.name in PASSED_IN.get(stage, ())
    declared = item.name in {field.name for field in declared_settings(stage)}
    assert passed != declared, f"{stage.__name__}.{item.name}: a train.* setting (a default) or passed in (PASSED_IN)"
    assert declared == (item.name in SCHEMA_FIELDS)


def test_the_planner_passes_in_only_to_the_stages_of_the_train_section():
    assert set(PASSED_IN) <= set(TRAIN_STAGES)
    for stage, names in PASSED_IN.items():
        assert set(names) <= {item.name for item in dataclasses.fields(stage)}, stage.__name__


def test_a_stages_settings_are_frozen_and_the_schema_section_is_not():
    assert all(stage.__dataclass_params__.frozen for stage in TRAIN_STAGES)
    section = OmegaConf.structured(TrainConfig)
    section.lr = 3e-4  # Hydra merges the config files and the command line into the schema
    settings = section_settings(OptimizerSettings, section)
    assert settings.lr == 3e-4
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.lr = 1.0


def test_a_setting_declared_by_two_types_is_refused():
    @dataclasses.dataclass(frozen=True)
    class One:
        lr: float = 1.0

    @dataclasses.dataclass(frozen=True)
    class Other:
        lr: float = 2.0

    with pytest.raises(TypeError, match="train.lr is declared by both"):
        schema_section("Section", (One, Other), __name__, "")


def test_the_planner_passes_in_what_it_lists():
    with pytest.raises(TypeError, match="PASSED_IN"):
        section_settings(OptimizerSettings, OmegaConf.structured(TrainConfig), progress=True)
