"""A later command starts from the run's stored settings, the user's win, and a stored value is never a reason to
refuse: where a stored command setting (eval.*, sample.*, inspect.*) conflicts with what the user gives, it is
dropped with one line saying so.

The stored settings are generated from every distinct ``eval`` section that a committed run of results/ records
(the studies' own: variations, per-position plot lengths, strides, key-token settings, evaluators), each stored in a
tiny RoPE run, then planned (experiment.build.load_trained_run, as eval.py, sample.py and inspect_attention.py do)
with each setting a user may give: a scaling, a remap, other lengths, another protocol.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from cli_runs import REPO
from omegaconf import OmegaConf
from tiny_checkpoint import make_run

from core.checkpoint_io import last_checkpoint_path, load_checkpoint
from core.errors import PosGPTError
from experiment.build import load_trained_run
from experiment.config import EvalConfig


def stored_eval_sections() -> list[dict]:
    """One ``eval`` section for each set of keys that the committed runs store away from the defaults (the first
    found): runs that differ only in a value of the same keys constrain the same settings."""
    defaults = OmegaConf.to_container(OmegaConf.structured(EvalConfig))
    sections = {}
    for path in sorted((REPO / "results").glob("**/eval/*.json")):
        config = json.loads(path.read_text()).get("config")
        if isinstance(config, dict) and isinstance(config.get("eval"), dict):
            stored = config["eval"]
            changed = sorted(key for key, value in stored.items() if defaults.get(key, value) != value)
            sections.setdefault(json.dumps(changed), stored)
    return list(sections.values())


# What a study or a user stores that constrains the other settings, beside what the committed runs store.
CONSTRAINING = [
    {"variations": ["none", "yarn:2"]},
    {"protocols": ["nonoverlapping", "sliding"], "stride": 8},
    {"lengths": [16, 64], "per_position_plot_lengths": [64]},
    {"key_tokens": True, "protocols": ["sliding"], "key_evaluator": "/no/such/run"},
]
SECTIONS = stored_eval_sections() + CONSTRAINING
GIVEN = {
    "yarn": ["pe.scaling.type=yarn", "pe.scaling.factor=2"],
    "remap": ["pe.remap.type=rerope", "pe.remap.window=8"],
    "lengths": ["eval.lengths=[16,32]"],
    "protocol": ["eval.protocols=[nonoverlapping]"],
    "variations": ["eval.variations=[none,ntk:2]"],
}
# eval.py with each; sample.py and inspect_attention.py, which read the same stored config, with a remap
CASES = [("eval.py", given) for given in sorted(GIVEN)] + [
    (command, "remap") for command in ("sample.py", "scripts/inspect_attention.py")
]


@pytest.fixture(scope="module")
def rope_run(cli, tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("stored") / "run", cli.corpus, "pe=rope")


def test_the_committed_runs_are_read():
    assert len(SECTIONS) > len(CONSTRAINING) + 2


@pytest.mark.slow
@pytest.mark.parametrize("command, given", CASES)
def test_a_stored_command_setting_is_never_a_reason_to_refuse(rope_run, tmp_path, capsys, given, command):
    checkpoint = load_checkpoint(rope_run)
    refused = []
    for index, section in enumerate(SECTIONS):
        run = tmp_path / f"run{index}"
        last_checkpoint_path(run).parent.mkdir(parents=True)
        stored = {**checkpoint, "config": {**checkpoint["config"], "eval": {**checkpoint["config"]["eval"], **section}}}
        torch.save(stored, last_checkpoint_path(run))
        try:
            planned = load_trained_run(run, GIVEN[given], command)
        except PosGPTError as error:
            refused.append(f"{index}: {error}")
            continue
        for setting in GIVEN[given]:  # what the user gave is what runs
            key, _, value = setting.partition("=")
            assert _value(planned.cfg, key) == yaml.safe_load(value), setting
    assert refused == []
    for line in capsys.readouterr().out.splitlines():  # each drop said in one line, naming the setting
        assert "dropped: it conflicts with the settings given" in line and "the run's stored" in line


def _value(cfg, key: str):
    node = OmegaConf.select(cfg, key)
    return OmegaConf.to_container(node) if OmegaConf.is_config(node) else node
