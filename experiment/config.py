"""The typed config schema (Hydra structured configs), its registration with Hydra, and its validation.

YAML files under configs/ only set values; the dataclasses here (plus ModelConfig in model/gpt.py,
DataConfig in data/config.py and each positional scheme's own dataclass in model/pe/) define which keys
exist and their types, so a misspelt key or a wrong type fails at start-up, and a key added with Hydra's
``+`` (which the schema cannot stop) is refused by :func:`validate`.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from core.domain import check_domains, domain
from core.errors import PosGPTError
from core.runtime import MAX_SEED
from data.config import DataConfig
from model.gpt import ModelConfig, validate_model_config
from model.pe import SCHEMES


@dataclass
class TrainConfig:
    seq_len: int = domain(64, ge=1)  # training context length: the "1x" of every extrapolation result
    batch_size: int = domain(8, ge=1)  # sequences per optimizer step, over all processes and accumulation steps
    grad_accum_steps: int = domain(1, ge=1)
    max_steps: int = domain(1200, ge=1)
    lr: float = domain(1e-3, gt=0)
    min_lr_ratio: float = domain(0.1, ge=0, le=1)  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = domain(100, ge=0)
    weight_decay: float = domain(0.1, ge=0)
    beta1: float = domain(0.9, ge=0, lt=1)
    beta2: float = domain(0.95, ge=0, lt=1)
    grad_clip: float = domain(1.0, ge=0)  # 0 disables clipping
    log_every: int = domain(10, ge=1)
    val_every: int = domain(200, ge=1)
    val_batches: int = domain(20, ge=1)
    checkpoint_every: int = domain(400, ge=1)
    keep_checkpoints: int = domain(2, ge=0)  # step checkpoints kept besides last.pt
    resume: bool = False
    init_from: str | None = None  # a run directory (or .pt) whose weights start this run: training/init_from.py
    seed: int = domain(1337, ge=0, le=MAX_SEED)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16
    compile: str = "auto"  # auto (on for CUDA) | true | false (typed true/false, Hydra passes "True"/"False")
    num_threads: int = domain(0, ge=0)  # CPU threads for torch; 0 keeps torch's default
    skip_nonfinite: bool = False  # skip steps whose loss is NaN/inf instead of stopping
    distributed: str = "ddp"  # ddp | fsdp (only used under torchrun)
    eval_after: bool = True  # run the extrapolation eval when training ends
    # randomized positions (Ruoss et al. 2023): train at sorted random positions from [0, N)
    random_positions: int | None = domain(None, ge=1)


@dataclass
class EvalConfig:
    lengths: list[int] | None = domain(None, ge=1)  # absolute lengths; None: length_multipliers x train.seq_len
    length_multipliers: list[int] = domain(default_factory=lambda: [1, 2, 4, 8], ge=1)
    protocols: list[str] = field(default_factory=lambda: ["nonoverlapping", "sliding"])
    stride: int | None = domain(None, ge=1)  # sliding-window stride; None: half the window
    max_tokens: int = domain(32768, ge=1)  # scored tokens per (length, protocol): the same token range for all
    batch_tokens: int = domain(16384, ge=1)  # tokens per forward pass (windows are batched up to this)
    # Several evaluation-time variations of the scheme in one go, in the scheme's own notation (its
    # parse_variation, model/pe/); None: the run as configured.
    variations: list[str] | None = None
    per_position_plot_lengths: list[int] | None = domain(None, ge=1)  # drawn in per_position.png; None: the longest


@dataclass
class WandbConfig:
    mode: str = "offline"  # offline | online | disabled
    project: str = "posgpt"
    entity: str | None = None
    group: str | None = None
    name: str | None = None
    tags: list[str] = field(default_factory=list)


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
    model: ModelConfig = field(default_factory=ModelConfig)
    pe: Any = MISSING  # one of the dataclasses in model/pe/, chosen by the `pe` group
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)  # sample.py
    inspect: InspectConfig = field(default_factory=InspectConfig)  # scripts/inspect_attention.py


COMPILE_SETTINGS = ("auto", "true", "false")


def register_configs() -> None:
    """Register the schema (``posgpt_schema``) and each scheme's dataclass (``schema/pe/<name>``) with Hydra."""
    store = ConfigStore.instance()
    store.store(name="posgpt_schema", node=Config)
    for name, scheme in SCHEMES.items():
        store.store(group="schema/pe", name=name, node=scheme.config_class)


def schema(pe_name: str) -> DictConfig:
    """The typed, empty-of-choices config of a run with scheme ``pe_name``: what every key and type must match."""
    if pe_name not in SCHEMES:
        raise PosGPTError(f"unknown positional scheme pe={pe_name!r}; choose one of {sorted(SCHEMES)}")
    cfg = OmegaConf.structured(Config)
    cfg.pe = OmegaConf.structured(SCHEMES[pe_name].config_class)
    return cfg


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


def compile_enabled(setting: str, device_type: str) -> bool:
    """train.compile: ``true``/``false`` (as typed, or the ``True``/``False`` Hydra makes of them), or ``auto``
    (on for CUDA only)."""
    setting = str(setting).lower()
    return setting == "true" or (setting == "auto" and device_type == "cuda")


def eval_lengths(cfg: DictConfig) -> list[int]:
    """The evaluation lengths: eval.lengths if given, else the multipliers times the training length."""
    if cfg.eval.lengths:
        return list(cfg.eval.lengths)
    return [m * cfg.train.seq_len for m in cfg.eval.length_multipliers]


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


def validate(cfg: DictConfig) -> None:
    """Checks that types alone cannot express; raises PosGPTError saying what to change."""
    unknown = unknown_keys(cfg, schema(cfg.pe.name))
    if unknown:
        raise PosGPTError(
            f"unknown config key {unknown[0]}: it is not in the schema (experiment/config.py, "
            "model/pe/); check its spelling with `python train.py --cfg job`"
        )
    config = OmegaConf.to_object(cfg)  # the dataclasses, which declare each numeric key's domain
    check_list_elements(config)
    check_domains(config)
    validate_model_config(config.model)
    t = cfg.train
    if t.dtype not in ("auto", "float32", "bfloat16"):
        raise PosGPTError(f"train.dtype must be auto, float32 or bfloat16 (got {t.dtype!r})")
    if str(t.compile).lower() not in COMPILE_SETTINGS:
        raise PosGPTError(f"train.compile must be auto, true or false (got {t.compile!r})")
    if t.random_positions is not None and t.random_positions < t.seq_len:
        raise PosGPTError(
            f"train.random_positions={t.random_positions} must be at least train.seq_len={t.seq_len} "
            "(each sequence draws seq_len distinct positions from [0, N))"
        )
    if t.distributed not in ("ddp", "fsdp"):
        raise PosGPTError(f"train.distributed must be ddp or fsdp (got {t.distributed!r})")
    if not eval_lengths(cfg):
        raise PosGPTError("eval.lengths (or eval.length_multipliers) must name at least one length")
    unknown = set(cfg.eval.protocols) - {"nonoverlapping", "sliding"}
    if unknown or not cfg.eval.protocols:
        raise PosGPTError(
            f"eval.protocols must be a non-empty subset of [nonoverlapping, sliding] (got {list(cfg.eval.protocols)})"
        )
    # The scheme checks its own settings with the evaluation-time variations asked for (model/pe/base.py).
    SCHEMES[cfg.pe.name].check_variations(OmegaConf.to_object(cfg.pe), list(cfg.eval.variations or []))
    if cfg.logging.wandb.mode not in ("offline", "online", "disabled"):
        raise PosGPTError(f"logging.wandb.mode must be offline, online or disabled (got {cfg.logging.wandb.mode!r})")
