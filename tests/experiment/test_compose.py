"""experiment/compose.py's compose_config against Hydra's own composition: it keeps Hydra's composition of the
defaults per choice of config files and applies the values with Hydra's function, so for every override it must give
what Hydra gives (the same config, its types and flags) or refuse in the same words. The overrides are generated: each
file of each config group; each generated setting (tests/support/generated_settings.py) of each scheme and task,
beside its choice; and the forms of Hydra's override grammar (add, force-add, delete, null,
a sweep, an interpolation, a package, Hydra's own node) on a key of each section."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from generated_settings import generated_settings
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from core.errors import PosGPTError
from data.tasks import TASKS, task_config_class
from experiment import CONFIG_DIR
from experiment.compose import check_group_choices, compose_config, hydra_errors_as_user_errors
from experiment.config import Config, register_configs
from model.pe import SCHEMES

GROUPS = sorted(path.name for path in CONFIG_DIR.iterdir() if path.is_dir() and path.name != "hydra")
CHOICES = [f"{group}={path.stem}" for group in GROUPS for path in sorted((CONFIG_DIR / group).glob("*.yaml"))]
SECTIONS = {name: kind for name, kind in typing.get_type_hints(Config).items() if dataclasses.is_dataclass(kind)}


def hydra_composed(overrides: list[str]):
    """Hydra's composition of ``overrides``, nothing kept between calls."""
    check_group_choices(overrides)
    register_configs()
    with hydra_errors_as_user_errors(), initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose("config", overrides=list(overrides))


def outcome(composer, overrides: list[str]) -> tuple:
    """What ``composer`` makes of ``overrides``: the config as YAML, each section's type and the root's struct
    flag, or the one line it refuses them with."""
    try:
        cfg = composer(overrides)
    except PosGPTError as error:
        return ("refused", str(error))
    types = {key: OmegaConf.get_type(cfg, key) for key in cfg}
    return (OmegaConf.to_yaml(cfg), types, OmegaConf.is_struct(cfg), OmegaConf.is_readonly(cfg))


def grammar_forms(key: str, value: str) -> list[list[str]]:
    """``key`` (a dotted setting whose valid value is ``value``) in each form of Hydra's override grammar."""
    section = key.split(".")[0]
    return [
        [f"+{key}={value}"],
        [f"++{key}={value}"],
        [f"~{key}"],
        [f"~{key}={value}"],
        [f"{key}=null"],
        [f"{key}={value},{value}"],
        [f"{key}=${{{section}}}"],
        [f"+{section}.not_a_key={value}"],
        [f"{section}.not_a_key={value}"],
        [f"{key}@pkg={value}"],
        [f"{key}={value}", f"{key}={value}"],
        [f"hydra.job.name={value}", f"{key}={value}"],
        [f"{key}={value}", "pe=alibi"],
        ["pe=alibi", f"{key}={value}", "~pe"],
    ]


def first_settings() -> list[list[str]]:
    """Each grammar form on the first generated setting of each section."""
    cases = []
    for name, kind in sorted(SECTIONS.items()):
        for setting in generated_settings(kind, f"{name}."):
            key, value = setting[-1].split("=", 1)
            cases += [[*setting[:-1], *form] for form in grammar_forms(key, value)]
            break
    return cases


def choice_settings() -> list[list[str]]:
    """Each generated setting of each scheme and task beside its choice (the sections of the default choices have
    the grammar's forms above: a value is applied to any section alike)."""
    cases = [
        [f"pe={name}", *s]
        for name, scheme in sorted(SCHEMES.items())
        for s in generated_settings(scheme.config_class, "pe.")
    ]
    cases += [
        [f"task={name}", *s] for name in sorted(TASKS) for s in generated_settings(task_config_class(name), "task.")
    ]
    return cases


FORMS = first_settings()
# the fast loop's: each file of each group, and the grammar's forms on one section's setting
FAST = [[choice] for choice in CHOICES] + FORMS[: len(FORMS) // len(SECTIONS)]


def test_the_cases_are_generated_from_every_group_and_section():
    assert {choice.split("=")[0] for choice in CHOICES} == set(GROUPS) >= {"pe", "task", "model", "data"}
    assert len(first_settings()) >= 14 * len(SECTIONS) >= 14 * 6
    assert len(choice_settings()) > 50


@pytest.mark.parametrize("overrides", FAST, ids=" ".join)
def test_a_composition_is_hydras(overrides):
    assert outcome(compose_config, overrides) == outcome(hydra_composed, overrides)


@pytest.mark.slow
def test_every_choices_settings_and_every_form_compose_as_hydra_composes_them():
    for overrides in [*choice_settings(), *FORMS]:
        assert outcome(compose_config, overrides) == outcome(hydra_composed, overrides), overrides
