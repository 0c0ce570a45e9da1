"""Each eval.* setting is declared once, in the settings type of the evaluator, or of the evaluation's plan, that reads
it (evaluation/settings.py): the schema's eval section is made from those types, and every field of an evaluator's
settings is one of its settings. The cases are generated from the types and the registered evaluators.
The properties every made section shares are tested in tests/core/test_settings.py."""

import dataclasses

import pytest
from omegaconf import OmegaConf

from core.settings import declared_settings
from evaluation.evaluator import registered
from evaluation.evaluators.perplexity import Perplexity, PerplexitySettings
from evaluation.settings import Batching, TokenBudget
from experiment.config import BUILT_IN_EVALUATORS, EVAL_STAGES, EvalConfig

SCHEMA_FIELDS = {item.name: item for item in dataclasses.fields(EvalConfig)}
BUILT_IN = {name: cls for name, cls in registered().items() if cls.__module__.startswith(BUILT_IN_EVALUATORS)}
EVALUATOR_FIELDS = [(name, item) for name, cls in BUILT_IN.items() for item in dataclasses.fields(cls.Settings)]


@pytest.mark.parametrize("evaluator, item", EVALUATOR_FIELDS, ids=[f"{e}.{f.name}" for e, f in EVALUATOR_FIELDS])
def test_every_field_of_an_evaluators_settings_is_a_schema_eval_setting_it_declares(evaluator, item):
    assert item.name in SCHEMA_FIELDS
    assert item in declared_settings(BUILT_IN[evaluator].Settings), "a built-in evaluator's field has its default"


def test_every_built_in_evaluators_settings_make_the_section():
    assert {cls.Settings for cls in BUILT_IN.values()} <= set(EVAL_STAGES)


def test_settings_several_evaluators_read_are_declared_in_a_type_they_share():
    readers = [cls for cls in BUILT_IN.values() if "max_tokens" in {f.name for f in dataclasses.fields(cls.Settings)}]
    assert len(readers) > 1 and all(issubclass(cls.Settings, TokenBudget) for cls in readers)
    assert issubclass(PerplexitySettings, Batching)


def test_an_evaluators_settings_are_read_by_field_name_from_the_composed_section_and_frozen():
    section = OmegaConf.structured(EvalConfig)
    section.max_tokens, section.protocols = 64, ["sliding"]  # Hydra merges the command line into the schema
    settings = Perplexity.of(OmegaConf.to_container(section)).settings
    assert (settings.max_tokens, settings.protocols) == (64, ("sliding",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.max_tokens = 1
