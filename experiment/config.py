"""The typed config schema (Hydra structured configs), its registration with Hydra, and its validation.

YAML files under configs/ only set values; the dataclasses here (plus ModelConfig in model/gpt.py,
DataConfig in data/config.py and each positional scheme's own dataclass in model/pe/) define which keys
exist and their types, so a misspelt key or a wrong type fails at start-up, and a key added with Hydra's
``+`` (which the schema cannot stop) is refused by :func:`validate`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
import typing
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from core.domain import (
    COMMANDS,
    check_domains,
    check_run_kind,
    check_used,
    choice,
    domain,
    is_set,
    read_with,
    readers_of,
    section,
)
from core.errors import PosGPTError
from core.runtime import MAX_SEED
from core.settings import check_declared_settings, schema_section
from data.config import DataConfig
from data.tasks import NO_TASK, TASKS, TaskConfig, build_task, task_config_class
from data.tokenizer import GPT2_N_VOCAB
from evaluation.context import evaluated_lengths
from evaluation.evaluator import registered
from evaluation.settings import TEXT, EvaluationSettings
from model.gpt import ModelConfig, model_dims, validate_model_config
from model.pe import SCHEMES
from model.temperature import check_temperature
from training.checkpointing import CheckpointSettings
from training.init_from import InitFromSettings
from training.loop import LoopSettings
from training.metrics import MetricsSettings
from training.optim import OptimizerSettings

# The training stages whose settings make the train section, in its order: each train.* setting is declared once, in
# the settings type of the stage that reads it, and checked by that type's check (training/settings.py), which
# validate runs.
TRAIN_STAGES = (LoopSettings, OptimizerSettings, CheckpointSettings, InitFromSettings, MetricsSettings)
TrainConfig = schema_section(
    "TrainConfig", TRAIN_STAGES, __name__, "train.*: the settings the training stages declare (TRAIN_STAGES).", "train"
)


BUILT_IN_EVALUATORS = "evaluation.evaluators."  # the package of the evaluators whose settings make the eval section


def built_in_evaluation_settings() -> tuple[type, ...]:
    """The settings types whose declarations make the eval section, in its order: the evaluation plan's, then each
    built-in evaluator's (evaluation/evaluators/), each once. A plug-in defined elsewhere adds none: its settings name
    eval.* keys these declare (evaluation/evaluator.py)."""
    built_in = [cls.Settings for cls in registered().values() if cls.__module__.startswith(BUILT_IN_EVALUATORS)]
    return (EvaluationSettings, *dict.fromkeys(built_in))


# Each eval.* setting is declared once, in the settings type of the evaluator, or of the evaluation's plan, that reads
# it; one several evaluators read, in a small type they inherit (evaluation/settings.py).
EVAL_STAGES = built_in_evaluation_settings()
EvalConfig = schema_section(
    "EvalConfig", EVAL_STAGES, __name__, "eval.*: the settings the evaluators and the evaluation plan declare.", "eval"
)


WANDB_ON = ("mode", ("offline", "online"))  # the run's identity in W&B: read only where W&B runs


@dataclass
class WandbConfig:
    mode: str = choice("offline", ("offline", "online", "disabled"))
    project: str = read_with("posgpt", used_with=WANDB_ON)
    entity: str | None = read_with(None, used_with=WANDB_ON)
    group: str | None = read_with(None, used_with=WANDB_ON)
    name: str | None = read_with(None, used_with=WANDB_ON)
    tags: list[str] = read_with(default_factory=list, used_with=WANDB_ON)


@dataclass
class LoggingConfig:
    wandb: WandbConfig = field(default_factory=WandbConfig)
    progress: bool = True  # tqdm progress bars


@dataclass
class SampleConfig:
    """sample.py's settings."""

    prompt: str = ""  # "" starts from <|endoftext|>
    prompt_file: str | None = None  # read the prompt from this file instead
    max_new_tokens: int = domain(200, ge=1)
    temperature: float = domain(0.8, ge=0)  # 0: greedy (argmax)
    top_k: int | None = domain(200, ge=1)  # sample among the k most likely tokens; None: all
    num_samples: int = domain(1, ge=1)
    seed: int = domain(1337, ge=0, le=MAX_SEED)


@dataclass
class InspectConfig:
    """scripts/inspect_attention.py's settings."""

    length_multipliers: list[int] = domain(default_factory=lambda: [1, 8], ge=1)  # window lengths, x train.seq_len
    windows: int = domain(4, ge=1)  # evaluation windows per length (consecutive, from the validation split's start)


@dataclass
class Config:
    """The whole config. Each section declares the commands (core.domain.COMMANDS) and the kinds of run that read
    its settings, unless a setting declares its own: a command given a setting it does not read refuses it
    (check_command_reads), and so does a run of a kind that does not read it (validate). The train.py that
    writes a run reads what it records for a later eval.py (eval.*), even when it does not evaluate itself."""

    model: ModelConfig = section(ModelConfig)  # every command builds the model
    pe: Any = section(default=MISSING)  # one of the dataclasses in model/pe/, chosen by the `pe` group
    # a dataclass of data/tasks/ (the `task` group); none: text; sample.py and the scripts take text runs only
    task: Any = section(TaskConfig, commands=("train", "eval"))
    data: DataConfig = section(DataConfig, commands=("train", "eval", "inspect"), runs=TEXT)  # a task makes its own
    train: TrainConfig = section(TrainConfig, commands=("train",))  # the benchmarks read some (BENCHMARKED)
    eval: EvalConfig = section(EvalConfig, commands=("train", "eval"))
    logging: LoggingConfig = section(LoggingConfig, commands=("train", "eval", "inspect"))  # sample.py logs nothing
    sample: SampleConfig = section(SampleConfig, commands=("sample",))  # sample.py
    inspect: InspectConfig = section(InspectConfig, commands=("inspect",))  # scripts/inspect_attention.py


@functools.cache
def register_configs() -> None:
    """Register the schema (``posgpt_schema``), each scheme's dataclass (``schema/pe/<name>``) and each task's
    (``schema/task/<name>``) with Hydra. Hydra's ConfigStore lives as long as the process, so once per process is
    enough; a command run again in the same process (tests run commands in-process) does not convert every
    dataclass to a config again.

    Hydra 1.3 deep-copies its config repository at every composition, and with it this process-wide store of every
    scheme's and task's schema: some 40% of a composition's time, copying what it only reads (a load deep-copies
    the node it hands out). Hydra's main line reads the live store instead (facebookresearch/hydra#2928); until a
    release has that, a copy of the store is the store itself."""
    ConfigStore.__deepcopy__ = _the_store_itself
    store = ConfigStore.instance()
    store.store(name="posgpt_schema", node=Config)
    for name, scheme in SCHEMES.items():
        store.store(group="schema/pe", name=name, node=scheme.config_class)
    for name in [NO_TASK, *TASKS]:
        store.store(group="schema/task", name=name, node=task_config_class(name))


def _the_store_itself(store: ConfigStore, memo: dict) -> ConfigStore:
    return store


def schema(pe_name: str, task_name: str = NO_TASK) -> DictConfig:
    """The typed, empty-of-choices config of a run with scheme ``pe_name`` and task ``task_name``: what every
    key and type must match."""
    if pe_name not in SCHEMES:
        raise PosGPTError(f"unknown positional scheme pe={pe_name!r}; choose one of {sorted(SCHEMES)}")
    return copy.deepcopy(_typed_schema(pe_name, task_name))  # a copy: the caller may change it


@functools.cache
def read_schema(pe_name: str, task_name: str = NO_TASK) -> DictConfig:
    """schema()'s config for reading only (its keys, types and defaults), one per (scheme, task), read-only: a check
    that runs at every plan reads it without copying it."""
    cfg = schema(pe_name, task_name)
    OmegaConf.set_readonly(cfg, True)
    return cfg


@functools.cache
def _typed_schema(pe_name: str, task_name: str) -> DictConfig:
    """schema()'s config, built once per (scheme, task): converting the dataclasses costs several times copying the
    result, and a comparison reads it for every run it loads."""
    cfg = OmegaConf.structured(Config)
    cfg.pe = OmegaConf.structured(SCHEMES[pe_name].config_class)
    cfg.task = OmegaConf.structured(task_config_class(task_name))
    return cfg


def choices_with(key: str) -> list[str]:
    """The choices of the group ``key`` lies in (``task`` or ``pe``) whose dataclass has dotted ``key``: what would
    read a task's or a scheme's setting given to a run of another (``task.n_pairs``: task=mqar)."""
    group, _, path = key.partition(".")
    classes = {
        "task": {name: task_config_class(name) for name in TASKS},
        "pe": {n: s.config_class for n, s in SCHEMES.items()},
    }
    return [f"{group}={name}" for name, kind in classes.get(group, {}).items() if _has_key(kind, path)]


def _has_key(kind: type, path: str) -> bool:
    """Whether dataclass ``kind`` (nested ones walked) has the dotted key ``path``."""
    name, _, rest = path.partition(".")
    found = {item.name: item for item in dataclasses.fields(kind)}.get(name)
    if found is None or not rest:
        return found is not None
    nested = typing.get_type_hints(kind).get(name)
    return dataclasses.is_dataclass(nested) and _has_key(nested, rest)


def set_task_vocabulary(cfg: DictConfig) -> None:
    """A task run's model has the task's vocabulary (a few dozen tokens, not GPT-2's 50,257): model.vocab_size
    is set from the task before the model is built, and so recorded in the run's checkpoints."""
    task = build_task(OmegaConf.to_object(cfg.task))
    if task is None:
        return
    given = cfg.model.vocab_size
    if given not in (ModelConfig.vocab_size, task.vocab_size):  # a value set for this run, which would be ignored
        raise PosGPTError(
            f"model.vocab_size={given} is set by task={task.name} to its own vocabulary ({task.vocab_size} tokens): "
            "drop model.vocab_size"
        )
    cfg.model.vocab_size = task.vocab_size


def unknown_keys(cfg: DictConfig, reference: DictConfig, prefix: str = "") -> list[str]:
    """Keys of ``cfg`` that ``reference`` (the schema) does not have, e.g. ones added with Hydra's ``+``."""
    unknown = []
    for key in cfg:
        if key not in reference:
            unknown.append(f"{prefix}{key}")
        elif OmegaConf.is_dict(cfg[key]) and dataclasses.is_dataclass(OmegaConf.get_type(reference, key)):
            # a typed section: its keys are fixed (a plain dict field may hold any key)
            unknown += unknown_keys(cfg[key], reference[key], f"{prefix}{key}.")
    return unknown


def eval_lengths(cfg: DictConfig) -> list[int]:
    """The evaluation lengths of a composed config (evaluation/context.py's evaluated_lengths)."""
    return evaluated_lengths(cfg.eval.lengths, cfg.eval.length_multipliers, cfg.train.seq_len)


def check_list_elements(config: Any, prefix: str = "") -> None:
    """PosGPTError naming the first element of a list setting that is not of the list's element type: OmegaConf
    types a list's scalars but lets a nested list or dict through (``eval.lengths=[[1]]``)."""
    hints = typing.get_type_hints(type(config))
    for item in dataclasses.fields(config):
        value, key = getattr(config, item.name), prefix + item.name
        if dataclasses.is_dataclass(value):
            check_list_elements(value, key + ".")
            continue
        if not isinstance(value, list):
            continue
        hint = hints[item.name]
        if typing.get_origin(hint) is not list:  # list[X] | None
            (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        (kind,) = typing.get_args(hint)
        for i, element in enumerate(value):
            if not isinstance(element, (int, float) if kind is float else kind):
                raise PosGPTError(
                    f"{key}[{i}]={element} is not of type {kind.__name__}: {key} is a list of {kind.__name__}"
                )


def validate(
    cfg: DictConfig, reads_data: bool = True, keys: Collection[str] | None = None, command: str | None = None
) -> None:
    """Checks that types alone cannot express; raises PosGPTError saying what to change. ``reads_data=False``
    (scripts/speed.py, scripts/estimate.py: random token ids) skips what only relates the config to its data.
    ``keys``: a setting the run does not read is refused only among these dotted keys (an evaluation's overrides,
    experiment/build.py: a trained setting that an override leaves unread was read in training); None: all.
    ``command``: the script that evaluates, which refuses among ``keys`` what it never reads, after the domains."""
    unknown = unknown_keys(cfg, read_schema(cfg.pe.name, cfg.task.name))
    if unknown:
        raise PosGPTError(
            f"unknown config key {unknown[0]}: it is not in the schema (experiment/config.py, "
            "model/pe/); check its spelling with `python train.py --cfg job`"
        )
    config = OmegaConf.to_object(cfg)  # the dataclasses, which declare each numeric key's domain
    check_list_elements(config)
    check_domains(config)
    if command is not None:
        check_command_reads(config, command, keys or ())
    validate_model_config(config.model)
    check_temperature(config.model.attn_temperature, config.train.seq_len)
    check_declared_settings(TRAIN_STAGES, config.train)  # each train.* settings type's check (training/settings.py)
    # settings read by the other kind of run only (a task run has no perplexity protocols, and no corpus)
    kind, what = ("text", f"data={cfg.data.name}") if cfg.task.name == NO_TASK else ("task", f"task={cfg.task.name}")
    check_run_kind(config, kind, what, keys)
    _validate_scheme(cfg, config, keys)
    _validate_task(cfg, config, reads_data)


def check_command_reads(config: Any, command: str, keys: Collection[str]) -> None:
    """PosGPTError for a key among ``keys`` (those the user gave) that ``command`` (a script of core.domain's
    COMMANDS) never reads, as the schema declares (experiment/config.py): accepted, it would be ignored without a
    word. A script outside COMMANDS (an analysis in scripts/) is held only to what an evaluation may change."""
    for key in keys:
        if not command_reads(config, command, key):
            scripts = [COMMANDS[reader] for reader in readers_of(config, key).commands]
            read_by = ", ".join(scripts[:-1]) + " and " + scripts[-1] if len(scripts) > 1 else scripts[0]
            raise PosGPTError(f"{command} does not read {key} (read by {read_by}): drop it")


def command_reads(config: Any, command: str, key: str, kind: str | None = None) -> bool:
    """Whether script ``command`` reads dotted ``key`` (or a section of it) of a config dataclass instance, as the
    schema declares, in a run of ``kind`` (None: of any kind); true for a script outside COMMANDS and for a key the
    schema does not have."""
    name = next((name for name, script in COMMANDS.items() if script == command), None)
    readers = readers_of(config, key)
    if name is None or readers is None:
        return True
    return name in readers.commands and (kind is None or readers.runs is None or kind in readers.runs)


def _validate_scheme(cfg: DictConfig, config: Config, keys: Collection[str] | None) -> None:
    """No setting the run would not read (among ``keys``: core.domain's used_with, the scheme's unread_settings);
    then the scheme checks its own settings (model/pe/base.py) in the model they run in, and with the
    evaluation-time variations asked for."""
    # a scheme configured without an extension holds the settings its eval.variations entries read
    variation_types = frozenset(re.split(r"[:.]", spec)[0] for spec in cfg.eval.variations or [])
    check_used(config, also=variation_types, keys=keys, read=named_evaluator_keys(cfg.eval.evaluators or ()))
    dims = model_dims(config.model, cfg.train.seq_len)
    variations = list(cfg.eval.variations or [])
    SCHEMES[cfg.pe.name].check_settings(config.pe, dims, variations, lambda key: is_set(f"pe.{key}", keys))


def named_evaluator_keys(names: Collection[str]) -> frozenset[str]:
    """The eval.* keys the evaluators ``names`` read (their settings types' fields): eval.evaluators runs them
    whatever the switches that would otherwise ask for them (eval.tasks, eval.key_tokens, ...) hold."""
    evaluators = registered()
    return frozenset(
        f"eval.{field.name}"
        for name in names
        if name in evaluators
        for field in dataclasses.fields(evaluators[name].Settings)
    )


def _validate_task(cfg: DictConfig, config: Config, reads_data: bool) -> None:
    """The task's own settings (build_task checks them), that its format fits train.seq_len, and that the model's
    vocabulary holds the data's tokens. What the eval.task_* settings relate to the task is their types' check
    (evaluation/settings.py)."""
    task = build_task(OmegaConf.to_object(cfg.task))
    if reads_data and task is None:
        config.model.check_vocabulary(GPT2_N_VOCAB, f"data.name={cfg.data.name} is tokenized by GPT-2")
    elif reads_data:
        config.model.check_vocabulary(task.vocab_size, f"task={task.name}")
    if task is not None:
        task.check_fits(cfg.train.seq_len)
