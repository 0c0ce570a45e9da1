"""Each train.* setting is declared once, in the settings type of the stage that reads it (training/settings.py): the
schema's train section is made from those types, and a stage's settings hold nothing else but what the planner
passes in from other sections (experiment/plan.py, PASSED_IN). The cases are generated from the types.
The properties every made section shares are tested in tests/core/test_settings.py."""

import dataclasses

import pytest
from omegaconf import OmegaConf

from core.settings import declared_settings
from experiment.config import TRAIN_STAGES, TrainConfig
from experiment.plan import PASSED_IN, section_settings
from training.optim import OptimizerSettings

SCHEMA_FIELDS = {item.name: item for item in dataclasses.fields(TrainConfig)}
STAGE_FIELDS = [(stage, item) for stage in TRAIN_STAGES for item in dataclasses.fields(stage)]


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


def test_a_stages_settings_are_filled_from_the_composed_section_and_frozen():
    section = OmegaConf.structured(TrainConfig)
    section.lr = 3e-4  # Hydra merges the config files and the command line into the schema
    settings = section_settings(OptimizerSettings, section)
    assert settings.lr == 3e-4
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.lr = 1.0


def test_the_planner_passes_in_what_it_lists():
    with pytest.raises(TypeError, match="PASSED_IN"):
        section_settings(OptimizerSettings, OmegaConf.structured(TrainConfig), progress=True)
