"""experiment/config.py: the schema's registration with Hydra."""

import copy

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from experiment.compose import compose_config
from experiment.config import register_configs

COMPOSITIONS = (
    ["pe=rope"],
    ["pe=alibi", "task=mqar", "task.n_pairs=4"],
    ["pe=hybrid"],
    ["pe=rope", "pe.scaling.type=yarn", "pe.scaling.factor=2", "model=tiny_wide"],
)


def test_a_composition_shares_the_config_store_and_composes_what_a_copied_store_composes(monkeypatch):
    register_configs()
    store = ConfigStore.instance()
    assert copy.deepcopy(store) is store
    shared = [OmegaConf.to_yaml(compose_config(overrides)) for overrides in COMPOSITIONS]
    monkeypatch.delattr(ConfigStore, "__deepcopy__")  # Hydra's own behaviour: each composition copies the store
    assert copy.deepcopy(store) is not store
    assert [OmegaConf.to_yaml(compose_config(overrides)) for overrides in COMPOSITIONS] == shared


def test_a_config_stored_after_a_composition_is_composed_from_the_live_store():
    register_configs()
    compose_config(["pe=rope"])
    ConfigStore.instance().store(group="pe", name="test_registered_late", node={"name": "rope", "theta": 123.0})
    try:
        assert compose_config(["pe=test_registered_late"]).pe.theta == 123.0
    finally:
        ConfigStore.instance().repo["pe"].pop("test_registered_late.yaml")
