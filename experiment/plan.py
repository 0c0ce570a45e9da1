"""The plan of a training run: the composed config, checked, turned into the settings of each stage.

    config (Hydra) --plan_training--> TrainingPlan --train.py--> training.loop.train(plan, run_dir)

Every check of a config runs here, before anything is written or trained: the schema's domains, the data's and
the evaluation's settings, the model built on the meta device (its parameter count, a scheme's refusals), and a
``train.init_from`` parent read and held against this run. The stages take their part: the loop, the optimizer,
the checkpointer, the metrics and the tracker each define the settings they read (training/, core/tracking.py),
and none of them reads the config or imports this package. A sweep, or scripts/study.sh, plans every job first
(``train.py --check``): a bad value in its last job is refused before the first one trains.

A new ``train.*`` setting is declared once, as a field with a default of the settings type of the stage that reads it
(training/settings.py): the schema's train section is made from those types (experiment/config.py, TrainConfig), and
the stage's settings are filled here from it by field name. What a stage reads of another section, or what is worked
out here, is a field without a default, passed in (``PASSED_IN``). A check of its value is a ``check`` method of that
type, which the planner runs with every other such check (experiment/config.py, ``validate``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from omegaconf import DictConfig, OmegaConf

from core.checkpoint_io import last_checkpoint_path, load_checkpoint
from core.config_keys import RESUME_SETTINGS, RUNTIME_SETTINGS, flatten_config, overridden_keys
from core.domain import changed_keys
from core.errors import PosGPTError
from core.settings import declared_settings
from core.tracking import TrackerSettings
from data import validate_data_config
from data.tasks import NO_TASK
from evaluation.end_of_training import EndOfTrainingEvaluation
from evaluation.results import COPY_PROBE
from experiment.build import build_model, model_flops_per_token, open_trained_model
from experiment.compose import compose_config
from experiment.config import check_command_reads, set_task_vocabulary, validate
from experiment.eval_checks import check_eval_settings, evaluation_plan
from experiment.settings import changed_settings, given_wins, lay_over, trained_config
from model.pe import SCHEMES
from training.checkpointing import CheckpointSettings
from training.init_from import InitFromSettings, Parent
from training.loop import LoopSettings, ModelSpec, TrainingPlan, position_draw, rehearse
from training.metrics import MetricsSettings
from training.optim import OptimizerSettings

# Model settings a train.init_from child may change: how fast the same function is computed, or only training
# (dropout).
CHANGEABLE_MODEL_KEYS = ("model.dropout", *(key for key in RUNTIME_SETTINGS if key.startswith("model.")))

Settings = TypeVar("Settings")

# What each stage's settings hold besides the train.* settings it declares: another section's setting, or what the
# planner works out (the model's FLOPs, the resolved config), passed in by name; the stage declares them without a
# default (training/settings.py).
PASSED_IN: dict[type, tuple[str, ...]] = {
    LoopSettings: ("document_aware", "progress"),
    MetricsSettings: ("pe_name", "tokens_per_step", "flops_per_token", "explicit_positions", "progress"),
    CheckpointSettings: ("config", "config_yaml", "overrides", "planned_step"),
}


def section_settings(kind: type[Settings], section: DictConfig, **others: Any) -> Settings:
    """A stage's frozen settings: each train.* setting its type declares read from the config section's key of the
    same name (a nested section, such as pose, as its dataclass), and what the planner passes in, ``others``
    (``PASSED_IN[kind]``, each of them)."""
    if set(others) != set(PASSED_IN.get(kind, ())):
        raise TypeError(f"{kind.__name__} is passed {sorted(others)}; PASSED_IN lists {PASSED_IN.get(kind, ())}")
    declared = {item.name: section[item.name] for item in declared_settings(kind)}
    typed = {
        name: OmegaConf.to_object(value) if OmegaConf.is_config(value) else value for name, value in declared.items()
    }
    return kind(**typed, **others)


def optimizer_settings(cfg: DictConfig) -> OptimizerSettings:
    return section_settings(OptimizerSettings, cfg.train)


def tracker_settings(cfg: DictConfig) -> TrackerSettings:
    """The W&B run of any command (train.py, eval.py, the scripts), tagged with the run's scheme."""
    wb = cfg.logging.wandb
    return TrackerSettings(
        mode=wb.mode,
        project=wb.project,
        entity=wb.entity,
        group=wb.group,
        name=wb.name,
        tags=tuple(sorted({*wb.tags, f"pe={cfg.pe.name}"})),
        config=OmegaConf.to_container(cfg, resolve=True),
    )


def plan_training(cfg: DictConfig, overrides: list[str], run_dir: Path) -> TrainingPlan:
    """The plan of training ``cfg`` (composed from ``overrides``, of which none may be a setting only another
    command reads) in ``run_dir``; PosGPTError for anything that would refuse it, before anything is written. Sets
    the task's vocabulary in ``cfg``. A resume starts from the config of the checkpoint ``run_dir`` holds, the
    settings given laid over it (resumed_config)."""
    checkpoint = _resumed_checkpoint(cfg, run_dir)
    if checkpoint is not None:
        cfg = resumed_config(cfg, overrides, checkpoint["config"])
    evaluators = check_training_config(cfg)
    config = OmegaConf.to_object(cfg)
    # what the command line gives, and what a config file gives (a setting away from its default)
    check_command_reads(config, "train.py", [*overridden_keys(overrides), *changed_keys(config)])
    cfg, parent = load_parent(cfg)
    with torch.device("meta"):  # shapes only: a model of any size is planned in no memory and no time
        model = build_model(cfg)
    t = cfg.train
    draw = position_draw(t.random_positions, t.pose.target_len)
    if draw is not None:
        model.pe.check_random_positions(draw[1], draw[0])
    explicit = draw is not None or cfg.data.document_aware
    # what a later eval.py starts from, with train.eval_after=false too (the parent changes no eval.* setting)
    evaluation = plan_end_of_training(cfg, model, evaluators)
    metrics = section_settings(
        MetricsSettings,
        t,
        pe_name=cfg.pe.name,
        tokens_per_step=t.batch_size * t.seq_len,
        flops_per_token=model_flops_per_token(model, t.seq_len),
        explicit_positions=explicit,
        progress=cfg.logging.progress,
    )
    return TrainingPlan(
        loop=section_settings(LoopSettings, t, document_aware=cfg.data.document_aware, progress=cfg.logging.progress),
        model=ModelSpec(OmegaConf.to_object(cfg.model), OmegaConf.to_object(cfg.pe), t.seq_len, model.num_params()),
        optimizer=optimizer_settings(cfg),
        checkpoint=_checkpoint_settings(cfg, overrides, checkpoint, run_dir),
        metrics=metrics,
        tracker=tracker_settings(cfg),
        data=OmegaConf.to_object(cfg.data),
        task=OmegaConf.to_object(cfg.task),
        parent=parent,
        evaluation=evaluation if t.eval_after else None,
    )


def check_training_config(cfg: DictConfig) -> list:
    """Everything a training run's config alone can be refused for (sets the task's vocabulary); the evaluators of
    its evaluation, selected and typed (plan_evaluators)."""
    set_task_vocabulary(cfg)
    validate(cfg)
    # here, not at data loading: every rank fails alike, before any collective
    data = OmegaConf.to_object(cfg.data)
    validate_data_config(data)
    draw = position_draw(cfg.train.random_positions, cfg.train.pose.target_len)
    data.check_training(draw[0] if draw else None)
    # The eval.* settings the run stores, which its end-of-training evaluation and a later eval.py start from: checked
    # with train.eval_after=false too (plan_end_of_training then plans them on the model).
    evaluators = plan_evaluators(cfg)  # eval.evaluators names evaluators of this kind of run
    check_eval_settings(cfg, evaluators)
    probing = any(evaluator.name == COPY_PROBE for evaluator in evaluators)  # by eval.tasks or by name
    if probing and cfg.eval.copy_min_count:  # the copy probe counts tokens of the training split
        from evaluation.copy_probe import probe_candidates

        probe_candidates(data, cfg.eval.copy_min_count, cfg.model.vocab_size, cfg.logging.progress)
    return evaluators


def _resumed_checkpoint(cfg: DictConfig, run_dir: Path) -> dict | None:
    """The checkpoint a resume in ``run_dir`` continues; None for a fresh run, or where there is none (the loop
    refuses a resume of nothing)."""
    path = last_checkpoint_path(run_dir)
    return load_checkpoint(path) if cfg.train.resume and path.is_file() else None


def resumed_config(composed: DictConfig, overrides: list[str], saved_config: dict) -> DictConfig:
    """The config a resume trains with: the checkpoint's (typed by today's schema), with the settings the user gives
    (``overrides``, their values as ``composed`` holds them) laid over it. A setting the user leaves out is the
    run's own, whatever today's default; a stored command setting (eval.*, ...) that conflicts with those given is
    dropped, saying so (given_wins). A given setting that a resume may not change is refused by
    ``_checked_resume``, once train.init_from's parent has been laid over as the run was trained."""
    cfg = trained_config(saved_config)
    keys = [key for key in overridden_keys(overrides) if re.split(r"[./]", key)[0] != "hydra"]  # Hydra's own
    lay_over(cfg, composed, keys, overrides)
    return given_wins(cfg, keys, check_training_config, "train.py")


def _checkpoint_settings(
    cfg: DictConfig, overrides: list[str], resumed: dict | None, run_dir: Path
) -> CheckpointSettings:
    config = OmegaConf.to_container(cfg, resolve=True)
    return section_settings(
        CheckpointSettings,
        cfg.train,
        config=config,
        config_yaml=OmegaConf.to_yaml(cfg, resolve=True),
        overrides=tuple(overrides),
        planned_step=_checked_resume(config, resumed, run_dir) if resumed is not None else None,
    )


def _checked_resume(config: dict, checkpoint: dict, run_dir: Path) -> int:
    """The step of the checkpoint a resume in ``run_dir`` continues, once its settings are checked against
    ``config``'s: a resume may not change how the run trains."""
    changed = resume_changes(config, checkpoint["config"])
    if changed:
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        raise PosGPTError(
            f"cannot resume {run_dir}: it was trained with {', '.join(changed[:3])}{more}. Leave them out to resume "
            "with the run's own, or start a new run in another hydra.run.dir"
        )
    return checkpoint["step"]


def resume_changes(now: dict, saved_config: dict) -> list[str]:
    """The settings a checkpoint's config (``saved_config``) was trained with that a resume with the config ``now``
    would change, though experiment/settings.py does not let it: ``key=saved (now value)`` each."""
    # Typed by today's schema: a setting added since the checkpoint was written reads as its default (or as
    # its legacy value, experiment/settings.py), not as a change.
    saved = OmegaConf.to_container(trained_config(saved_config), resolve=True)
    changed = changed_settings(saved, now, RESUME_SETTINGS)
    saved, now = flatten_config(saved), flatten_config(now)
    return [f"{key}={saved.get(key)} (now {now.get(key)})" for key in changed]


def load_parent(cfg: DictConfig) -> tuple[DictConfig, Parent | None]:
    """The parent run of ``train.init_from`` (None when unset), checked against ``cfg``, and the config the new run
    trains with: ``cfg`` with ``train.init_from`` made absolute and what its scheme takes from the parent
    (``PositionalEncoding.inherit``). ``cfg`` itself is left as it is (training/init_from.py).
    """
    settings = section_settings(InitFromSettings, cfg.train)
    if settings.init_from is None:
        return cfg, None
    path = Path(settings.init_from).expanduser().resolve()
    try:
        checkpoint = load_checkpoint(path)
    except PosGPTError as error:
        raise PosGPTError(f"train.init_from: {error}") from None
    parent_cfg = checkpoint["config"]
    replaces = settings.init_from_pe == "replace"
    check_same_architecture(OmegaConf.to_container(cfg, resolve=True), parent_cfg, str(path), replaces)
    scheme, parent_scheme = SCHEMES[cfg.pe.name], parent_cfg["pe"]["name"]
    parent = Parent(
        str(path), checkpoint["step"], parent_cfg["train"]["seq_len"], checkpoint["model"], parent_scheme, replaces
    )
    pe = OmegaConf.to_object(cfg.pe)
    if parent_scheme == cfg.pe.name:  # what a scheme takes from a parent of its own kind
        pe = scheme.inherit(pe, OmegaConf.to_object(trained_config(parent_cfg).pe), parent.seq_len)
    return OmegaConf.merge(cfg, {"train": {"init_from": str(path)}, "pe": dataclasses.asdict(pe)}), parent


def check_same_architecture(now: dict, parent: dict, where: str, replaces_scheme: bool = False) -> None:
    """PosGPTError naming the first ``model.*`` or ``pe.*`` key that differs, except those a child may change (with
    ``replaces_scheme``, every ``pe.*``: the child's scheme starts afresh)."""
    if now["pe"]["name"] != parent["pe"]["name"] and not replaces_scheme:
        raise PosGPTError(
            f"train.init_from: {where} was trained with pe={parent['pe']['name']}, this run has "
            f"pe={now['pe']['name']}; a run starts from weights of its own scheme, unless train.init_from_pe=replace "
            "(the parent's position parameters dropped, the new scheme's trained from their initialisation)"
        )
    changeable = (*CHANGEABLE_MODEL_KEYS, *(f"pe.{name}" for name in SCHEMES[now["pe"]["name"]].eval_time_settings))
    architecture = ("model",) if replaces_scheme else ("model", "pe")
    changed = changed_settings({k: parent[k] for k in architecture}, {k: now[k] for k in architecture}, changeable)
    if changed:
        key = changed[0]
        theirs, ours = flatten_config(parent).get(key), flatten_config(now).get(key)
        raise PosGPTError(
            f"train.init_from: {key}={theirs} in {where} but {ours} here; the parent's architecture must be "
            f"kept (only train.*, data, eval, logging, {', '.join(sorted(changeable))} may differ)"
        )


def plan_end_of_training(
    cfg: DictConfig, model: torch.nn.Module | None = None, evaluators: list | None = None
) -> EndOfTrainingEvaluation:
    """The evaluation at the end of training (train.eval_after), planned with the run, before the first step: its
    evaluators are selected and checked, and every variation (eval.variations) is applied once to the model planned
    on the meta device (``model``; None: built here), so that what the evaluation would refuse (a ReRoPE window past
    the training length, a scaling without its factors, a remap the model's sink cannot take) refuses the training
    run, and ``train.py --check``, instead of a trained run's last step. A run trained with train.eval_after=false
    plans it too: the run stores its eval.* settings, and a later eval.py starts from them. It takes the run's
    config as eval.py's evaluation does (evaluation.context.EvaluationPlan). ``evaluators``: those
    check_training_config selected of ``cfg`` (None: selected here)."""
    if model is None:
        with torch.device("meta"):
            model = build_model(cfg)
    evaluators = plan_evaluators(cfg) if evaluators is None else evaluators
    planned = evaluation_plan(cfg, evaluators)
    context = planned.context(model, Path("."), torch.device("meta"), torch.float32, {}, open_run=_no_run)
    for _ in context.variations():  # each applied once, and taken off again
        pass
    for evaluator in evaluators:
        evaluator.check(context)
    settings = OmegaConf.to_container(cfg.eval, resolve=True)
    return EndOfTrainingEvaluation(planned, evaluators, settings, cfg.eval.max_tokens, open_trained_model)


def check_later_evaluation(training: list[str], evaluation: list[str]) -> None:
    """PosGPTError for what eval.py, given the overrides ``evaluation``, would refuse of the run that train.py
    trains from the overrides ``training``, before that run exists (a study plans the evaluation that follows each
    run): the run's config with ``evaluation`` laid over it, checked whole as train.py checks a config, then
    planned on its model built on the meta device, as eval.py plans it on the trained model."""
    cfg = compose_config([*training, *evaluation])
    plan_end_of_training(cfg, evaluators=check_training_config(cfg))


def _no_run(run_dir: str | Path):
    """At plan time no other run is opened (eval.key_evaluator is checked to be a run by KeyTokenSettings.check, run by
    check_eval_settings)."""
    return None


def run_kind(cfg: DictConfig) -> str:
    """ "text" for a language-model run, "task" for a run of a synthetic task."""
    return "text" if cfg.task.name == NO_TASK else "task"


def plan_evaluators(cfg: DictConfig) -> list:
    """The evaluators of the run's evaluation, each with its typed settings (evaluation/evaluator.py)."""
    from evaluation.evaluator import select_evaluators

    return select_evaluators(OmegaConf.to_container(cfg.eval, resolve=True), run_kind(cfg))  # plain values, no config


def plan_each(jobs: list[list[str]], compose: Callable[[list[str]], DictConfig], run_dirs: list[Path]) -> None:
    """Plan every job (each composed from its overrides by ``compose``, to run in its entry of ``run_dirs``) and make
    every check its run makes before its first write (training.loop.rehearse: its data, its starting weights, its
    first forward pass), before the first one trains: one invalid value or corpus stops them all, naming its job by
    the overrides that set it apart from the others. The plans are not kept: each job plans itself again when it
    starts."""
    for number, (job, run_dir) in enumerate(zip(jobs, run_dirs, strict=True)):
        try:
            rehearse(plan_training(compose(job), job, run_dir), run_dir)
        except PosGPTError as error:
            if len(jobs) == 1:
                raise
            swept = [override for override in job if any(override not in other for other in jobs)]
            raise type(error)(f"job {number} of the sweep ({' '.join(swept)}): {error}") from None
