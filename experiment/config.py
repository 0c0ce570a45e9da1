"""The typed config schema (Hydra structured configs), its registration with Hydra, and its validation.

YAML files under configs/ only set values; the dataclasses here (plus ModelConfig in model/gpt.py,
DataConfig in data/config.py and each positional scheme's own dataclass in model/pe/) define which keys
exist and their types, so a misspelt key or a wrong type fails at start-up, and a key added with Hydra's
``+`` (which the schema cannot stop) is refused by :func:`validate`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from core.errors import PosGPTError
from data.config import DataConfig
from data.tasks import NO_TASK, TASKS, TaskConfig, build_task, task_config_class
from model.gpt import ModelConfig, validate_model_config
from model.pe import SCHEMES
from model.pe.rope_scaling import parse_scaling


@dataclass
class TrainConfig:
    seq_len: int = 64  # training context length: the "1x" of every extrapolation result
    batch_size: int = 8  # sequences per optimizer step, over all processes and accumulation steps
    grad_accum_steps: int = 1
    max_steps: int = 1200
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0 disables clipping
    log_every: int = 10
    val_every: int = 200
    val_batches: int = 20
    checkpoint_every: int = 400
    keep_checkpoints: int = 2  # step checkpoints kept besides last.pt
    resume: bool = False
    init_from: str | None = None  # a run directory (or .pt) whose weights start this run: training/init_from.py
    seed: int = 1337
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16
    compile: str = "auto"  # auto (on for CUDA) | true | false (typed true/false, Hydra passes "True"/"False")
    num_threads: int = 0  # CPU threads for torch; 0 keeps torch's default
    skip_nonfinite: bool = False  # skip steps whose loss is NaN/inf instead of stopping
    distributed: str = "ddp"  # ddp | fsdp (only used under torchrun)
    eval_after: bool = True  # run the extrapolation eval when training ends
    # randomized positions (Ruoss et al. 2023): train at sorted random positions from [0, N)
    random_positions: int | None = None


@dataclass
class EvalConfig:
    lengths: list[int] | None = None  # absolute lengths; None: length_multipliers x train.seq_len
    length_multipliers: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    protocols: list[str] = field(default_factory=lambda: ["nonoverlapping", "sliding"])
    stride: int | None = None  # sliding-window stride; None: half the window
    max_tokens: int = 32768  # scored tokens per (length, protocol): the same token range for all
    batch_tokens: int = 16384  # tokens per forward pass (windows are batched up to this)
    # RoPE only: evaluate several context extensions in one go, e.g. [none,yarn:8,ntk:8] (TYPE or TYPE:FACTOR);
    # None: just the run's pe.scaling.
    scalings: list[str] | None = None
    per_position_plot_lengths: list[int] | None = None  # lengths drawn in per_position.png; None: the longest
    # Task runs (task=...; evaluation/tasks.py): each cell gets enough examples for a 95% interval of at most
    # ± task_half_width; the effective length is the longest length up to which accuracy >= task_threshold.
    task_half_width: float = 0.05
    task_threshold: float = 0.9
    task_depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])  # passkey's grid
    # Zero-shot probes of a language-model run, after its perplexity: [copy_probe] (evaluation/copy_probe.py)
    tasks: list[str] = field(default_factory=list)
    copy_span: int = 16  # tokens in the copy probe's repeated span


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
    """sample.py's settings (checked in sample.py)."""

    prompt: str = ""  # "" starts from <|endoftext|>
    prompt_file: str | None = None  # read the prompt from this file instead
    max_new_tokens: int = 200
    temperature: float = 0.8  # 0: greedy (argmax)
    top_k: int | None = 200  # sample among the k most likely tokens; None: all
    num_samples: int = 1
    seed: int = 1337


@dataclass
class InspectConfig:
    """scripts/inspect_attention.py's settings."""

    length_multipliers: list[int] = field(default_factory=lambda: [1, 8])  # window lengths, x train.seq_len
    windows: int = 4  # evaluation windows per length (consecutive, from the start of the validation split)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    pe: Any = MISSING  # one of the dataclasses in model/pe/, chosen by the `pe` group
    task: Any = field(default_factory=TaskConfig)  # a dataclass of data/tasks/ (the `task` group); none: text
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)  # sample.py
    inspect: InspectConfig = field(default_factory=InspectConfig)  # scripts/inspect_attention.py


COMPILE_SETTINGS = ("auto", "true", "false")


def register_configs() -> None:
    """Register the schema (``posgpt_schema``), each scheme's dataclass (``schema/pe/<name>``) and each task's
    (``schema/task/<name>``) with Hydra."""
    store = ConfigStore.instance()
    store.store(name="posgpt_schema", node=Config)
    for name, scheme in SCHEMES.items():
        store.store(group="schema/pe", name=name, node=scheme.config_class)
    for name in [NO_TASK, *TASKS]:
        store.store(group="schema/task", name=name, node=task_config_class(name))


def schema(pe_name: str, task_name: str = NO_TASK) -> DictConfig:
    """The typed, empty-of-choices config of a run with scheme ``pe_name`` and task ``task_name``: what every
    key and type must match."""
    if pe_name not in SCHEMES:
        raise PosGPTError(f"unknown positional scheme pe={pe_name!r}; choose one of {sorted(SCHEMES)}")
    cfg = OmegaConf.structured(Config)
    cfg.pe = OmegaConf.structured(SCHEMES[pe_name].config_class)
    cfg.task = OmegaConf.structured(task_config_class(task_name))
    return cfg


def set_task_vocabulary(cfg: DictConfig) -> None:
    """A task run's model has the task's vocabulary (a few dozen tokens, not GPT-2's 50,257): model.vocab_size
    is set from the task before the model is built, and so recorded in the run's checkpoints."""
    task = build_task(OmegaConf.to_object(cfg.task))
    if task is not None:
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


def validate(cfg: DictConfig) -> None:
    """Checks that types alone cannot express; raises PosGPTError saying what to change."""
    unknown = unknown_keys(cfg, schema(cfg.pe.name, cfg.task.name))
    if unknown:
        raise PosGPTError(
            f"unknown config key {unknown[0]}: it is not in the schema (experiment/config.py, "
            "model/pe/); check its spelling with `python train.py --cfg job`"
        )
    validate_model_config(OmegaConf.to_object(cfg.model))
    t = cfg.train
    for key in (
        "seq_len",
        "batch_size",
        "grad_accum_steps",
        "max_steps",
        "log_every",
        "val_every",
        "val_batches",
        "checkpoint_every",
    ):
        if t[key] <= 0:
            raise PosGPTError(f"train.{key} must be positive (got {t[key]})")
    for key in ("warmup_steps", "keep_checkpoints", "num_threads", "weight_decay", "grad_clip"):
        if t[key] < 0:
            raise PosGPTError(f"train.{key} must be >= 0 (got {t[key]})")
    if t.lr <= 0:
        raise PosGPTError(f"train.lr must be positive (got {t.lr})")
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
    lengths = eval_lengths(cfg)
    if not lengths or min(lengths) <= 0:
        raise PosGPTError(f"evaluation lengths must be positive (got {lengths})")
    unknown = set(cfg.eval.protocols) - {"nonoverlapping", "sliding"}
    if unknown or not cfg.eval.protocols:
        raise PosGPTError(
            f"eval.protocols must be a non-empty subset of [nonoverlapping, sliding] (got {list(cfg.eval.protocols)})"
        )
    if cfg.eval.stride is not None and cfg.eval.stride <= 0:
        raise PosGPTError(f"eval.stride must be positive (got {cfg.eval.stride})")
    if cfg.eval.max_tokens <= 0 or cfg.eval.batch_tokens <= 0:
        raise PosGPTError("eval.max_tokens and eval.batch_tokens must be positive")
    if cfg.eval.scalings:
        if "scaling" not in cfg.pe:
            raise PosGPTError(f"eval.scalings are RoPE context extensions; this run has pe={cfg.pe.name}")
        if cfg.pe.scaling.type != "none":
            raise PosGPTError("set either pe.scaling.type (one scaling) or eval.scalings (several), not both")
        for spec in cfg.eval.scalings:
            parse_scaling(spec)
    scaling = cfg.pe.get("scaling")
    if (
        scaling is not None
        and scaling.type == "none"
        and scaling.attention_factor is not None
        and not any(parse_scaling(spec).type == "yarn" for spec in cfg.eval.scalings or [])
    ):
        raise PosGPTError(
            "pe.scaling.attention_factor is YaRN's temperature: it needs pe.scaling.type=yarn or a "
            "yarn entry in eval.scalings"
        )
    if any(length <= 0 for length in cfg.eval.per_position_plot_lengths or []):
        raise PosGPTError(f"eval.per_position_plot_lengths must be positive (got {cfg.eval.per_position_plot_lengths})")
    _validate_task(cfg)
    if cfg.logging.wandb.mode not in ("offline", "online", "disabled"):
        raise PosGPTError(f"logging.wandb.mode must be offline, online or disabled (got {cfg.logging.wandb.mode!r})")


PROBES = ("copy_probe",)  # eval.tasks: zero-shot probes of a language-model run


def _validate_task(cfg: DictConfig) -> None:
    """The task's own settings (build_task checks them), that its format fits train.seq_len, and the eval.task_*
    settings; eval.tasks (probes of a language-model run)."""
    task = build_task(OmegaConf.to_object(cfg.task))
    if set(cfg.eval.tasks) - set(PROBES):
        raise PosGPTError(f"eval.tasks may hold {list(PROBES)} (got {list(cfg.eval.tasks)})")
    if cfg.eval.tasks and task is not None:
        raise PosGPTError(f"eval.tasks probes a language-model run; this run was trained on task={task.name}")
    if cfg.eval.copy_span < 2:
        raise PosGPTError(f"eval.copy_span must be at least 2 (got {cfg.eval.copy_span})")
    if task is None:
        if cfg.eval.tasks:
            _validate_eval_task_settings(cfg.eval)
        return
    if cfg.train.seq_len + 1 < task.min_length():
        raise PosGPTError(
            f"task={task.name} needs train.seq_len >= {task.min_length() - 1} with its settings "
            f"(got {cfg.train.seq_len})"
        )
    _validate_eval_task_settings(cfg.eval)


def _validate_eval_task_settings(e: DictConfig) -> None:
    if not 0 < e.task_half_width <= 0.5:
        raise PosGPTError(f"eval.task_half_width must be in (0, 0.5] (got {e.task_half_width})")
    if not 0 < e.task_threshold <= 1:
        raise PosGPTError(f"eval.task_threshold must be in (0, 1] (got {e.task_threshold})")
    if any(not 0 <= depth <= 1 for depth in e.task_depths):
        raise PosGPTError(f"eval.task_depths are shares of the filler, in [0, 1] (got {list(e.task_depths)})")
