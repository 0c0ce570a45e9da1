"""The settings a resumed run or an evaluation may change, declared once: the checkpoint is the one source of truth.

A checkpoint holds the config it was trained with. Anything that decides what the trained weights compute
(any ``model.*`` but the speed switches, ``train.seq_len``, the scheme and its parameters) or, on resume,
which model training produces (the data, the optimizer, the seed, ...) comes from there. Overrides may only
touch the settings below; anything else is refused with one line that names the key.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from core.config_keys import RUNTIME_SETTINGS, flatten_config, may_change, overridden_keys
from core.errors import PosGPTError
from core.stored import check_literal
from data.tasks import NO_TASK, TASKS
from experiment.compose import compose_config, one_line
from experiment.config import check_command_reads, choices_with, command_reads, read_schema, schema
from model.pe import SCHEMES
from model.temperature import check_evaluation_change

# An evaluation may also score another corpus, at other lengths, with the scheme's declared variations
# (pe.<field> for field in the scheme's eval_time_settings) and with a training-free attention temperature
# (model/temperature.py: not one with learned parameters, check_evaluation_change).
EVAL_SETTINGS = (*RUNTIME_SETTINGS, "data.", "eval.", "sample.", "inspect.", "model.attn_temperature.")


def eval_settings(pe_name: str) -> tuple[str, ...]:
    """EVAL_SETTINGS plus the scheme's own evaluation-time variations."""
    scheme = SCHEMES.get(pe_name)
    return (*EVAL_SETTINGS, *(f"pe.{field}" for field in (scheme.eval_time_settings if scheme else ())))


def changed_settings(saved: dict, now: dict, allowed: tuple[str, ...]) -> list[str]:
    """The keys whose value differs between two resolved configs (plain dicts), less those in ``allowed``."""
    saved, now = flatten_config(saved), flatten_config(now)
    return [
        key
        for key in sorted(saved.keys() | now.keys())
        if saved.get(key) != now.get(key) and not may_change(key, allowed)
    ]


# Settings added to the schema after checkpoints were first written, whose default today is not what those
# checkpoints were trained with: a checkpoint that lacks the key gets this value, never today's default (a scheme's
# or a task's own: its legacy_values). (Every other key added since defaults to the earlier behaviour.)
LEGACY_VALUES = {"model.embedding": "gpt2"}
# The same for a scheme's settings, under pe.: scheme -> {setting: the value its older checkpoints were trained with}.
# A table, not code (scheme names appear only in model/pe/ and in data: tests/house/test_house_rules.py): the sinusoid's
# checkpoints written before pe.match_tokens existed trained without it.
LEGACY_PE_VALUES: dict[str, dict[str, Any]] = json.loads(Path(__file__).with_name("legacy_pe_values.json").read_text())
# Settings renamed since checkpoints were first written: old dotted key -> today's.
LEGACY_NAMES = {"eval.scalings": "eval.variations"}


def trained_config(saved_config: dict, source: str = "a stored config") -> DictConfig:
    """A checkpoint's config, typed by today's schema (so that it builds the model it was trained as). It is data:
    one holding an interpolation is refused, naming ``source`` (core.stored), never resolved."""
    saved = OmegaConf.create(check_literal(saved_config, source))
    for old, new in LEGACY_NAMES.items():
        section, _, key = old.rpartition(".")
        node = OmegaConf.select(saved, section, default=None)
        if OmegaConf.is_dict(node) and key in node:
            OmegaConf.update(saved, new, node.pop(key), force_add=True)
    task_name = saved.get("task", {}).get("name", NO_TASK)  # no task: written before tasks
    task = TASKS.get(task_name)
    legacy = {
        **LEGACY_VALUES,
        **{f"pe.{key}": value for key, value in LEGACY_PE_VALUES.get(saved["pe"]["name"], {}).items()},
        **{f"task.{key}": value for key, value in (task.legacy_values if task else {}).items()},
    }
    for key, value in legacy.items():
        if OmegaConf.select(saved, key, default=None) is None:
            OmegaConf.update(saved, key, value, force_add=True)
    cfg = schema(saved["pe"]["name"], task_name)
    try:
        return OmegaConf.unsafe_merge(cfg, saved)  # both are this function's own: no copies needed (1/3 faster)
    except OmegaConfBaseException as error:
        raise PosGPTError(f"the checkpoint's config does not fit this posgpt's schema: {one_line(error)}") from None


# The sections of settings that belong to a command, not to the trained model: what a run stored of them is how its
# own (end-of-training) evaluation ran, which a later command starts from and the user's settings replace.
COMMAND_SECTIONS = ("eval.", "sample.", "inspect.")


def given_wins(cfg: DictConfig, given: list[str], check: Callable[[DictConfig], None], command: str) -> DictConfig:
    """``cfg`` (the run's stored config with the user's ``given`` keys laid over it) once ``check`` accepts it. A
    stored command setting (COMMAND_SECTIONS) that the user did not give is never a reason to refuse: where
    ``check`` refuses, those that differ from their defaults are reset to them, then put back one at a time where
    ``check`` still accepts; what stays dropped is said in one line. A refusal that remains with every one of them
    reset is the user's settings' own, and is raised as it was."""
    try:
        check(cfg)
        return cfg
    except PosGPTError as refusal:
        defaults = flatten_config(OmegaConf.to_container(read_schema(cfg.pe.name, cfg.task.name)))
        stored = {
            key: value
            for key, value in flatten_config(OmegaConf.to_container(cfg)).items()
            if key.startswith(COMMAND_SECTIONS) and not any(may_change(key, (g, g + ".")) for g in given)
            and key in defaults and value != defaults[key]
        }  # fmt: skip
        trial = copy.deepcopy(cfg)
        for key in stored:
            OmegaConf.update(trial, key, defaults[key], merge=False)
        try:
            check(trial)
        except PosGPTError:
            raise refusal from None
    dropped = []
    for key, value in stored.items():  # keep every stored setting that does not conflict with what was given
        candidate = copy.deepcopy(trial)
        OmegaConf.update(candidate, key, value, merge=False)
        try:
            check(candidate)
            trial = candidate
        except PosGPTError:
            dropped.append(f"{key}={value}")
    if dropped:  # (each alone accepted, yet not all together: trial holds those put back)
        shown = ", ".join(dropped)
        print(f"{command}: the run's stored {shown} dropped: it conflicts with the settings given", flush=True)
    return trial


def config_for_evaluation(checkpoint: dict, overrides: list[str], command: str = "eval.py") -> DictConfig:
    """The config a checkpoint was trained with, plus ``overrides`` of the settings an evaluation may change.

    Group overrides (``data=text data.files=[...]``) are composed by Hydra as in train.py; only the keys the
    overrides name are taken from that composition, everything else from the checkpoint. ``command``: the
    script that evaluates (check_changeable).
    """
    cfg = trained_config(checkpoint["config"])
    keys = overridden_keys(overrides)
    check_changeable(cfg, keys, command)
    if not keys:
        return cfg
    composed = compose_config([f"pe={cfg.pe.name}", *overrides])
    trained = OmegaConf.to_object(cfg.model.attn_temperature)
    lay_over(cfg, composed, keys, overrides)
    check_evaluation_change(trained, OmegaConf.to_object(cfg.model.attn_temperature))
    return cfg


def lay_over(cfg: DictConfig, composed: DictConfig, keys: list[str], overrides: list[str]) -> None:
    """Set each of ``keys`` in a run's stored ``cfg`` to its value in ``composed`` (the user's ``overrides``, as
    Hydra composes them): the settings given win over the stored ones; a value the stored config cannot take is
    refused in one line."""
    try:
        for key in keys:
            OmegaConf.update(cfg, key, OmegaConf.select(composed, key), merge=False)
    except OmegaConfBaseException as error:
        raise PosGPTError(f"cannot apply {' '.join(overrides)}: {one_line(error)}") from None


def check_changeable(cfg: DictConfig, keys: list[str], command: str) -> None:
    """PosGPTError for the first of ``keys`` that an evaluation of the trained ``cfg`` by ``command`` may not
    change: one that ``command`` never reads says so (check_command_reads), and one of another task or scheme than
    the run's names those that read it; one that it reads is the checkpoint's."""
    allowed = eval_settings(cfg.pe.name)
    refused = [key for key in keys if not may_change(key, allowed)]
    if not refused:
        return
    config = OmegaConf.to_object(cfg)
    check_command_reads(config, command, refused)
    key = refused[0]
    readers = choices_with(key) if OmegaConf.select(cfg, key, default=MISSING) is MISSING else []
    if readers:
        group = key.partition(".")[0]
        raise PosGPTError(
            f"{key} is not a setting of this run ({group}={cfg[group].name}): it is read by {', '.join(readers)}"
        )
    current = OmegaConf.select(cfg, key, default=None)
    was = f" (it has {key}={current})" if current is not None and not OmegaConf.is_config(current) else ""
    kind = "text" if cfg.task.name == NO_TASK else "task"
    read = [name for name in allowed if command_reads(config, command, name.rstrip("."), kind)]
    raise PosGPTError(
        f"{key} cannot be changed for an evaluation: the model is the one the checkpoint's "
        f"config describes{was}. {command} may change {_describe(tuple(read))}"
    )


def _describe(allowed: tuple[str, ...]) -> str:
    """``data.*, eval.*, train.device, ...``: each setting once (data.cache_dir lies under data.*)."""
    shown = [
        name
        for name in allowed
        if not any(other != name and other.endswith(".") and name.startswith(other) for other in allowed)
    ]
    return ", ".join(name + "*" if name.endswith(".") else name for name in dict.fromkeys(shown))
