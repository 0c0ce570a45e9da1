"""The end-of-training evaluation is planned with the run: for every ``eval.*`` setting, generated from the schema
(tests/support/generated_settings.py: each declared choice, a flipped switch, each numeric domain's bound), on a
language-model run and on a task run, either the training plan refuses it (train.py and ``train.py --check``
alike, before any write: the planning writes nothing) or the evaluation the plan holds runs to its end on the model
the run starts from. A refusal of the evaluation after training, which would come after the run's checkpoint was
written, fails here. A run trained with ``train.eval_after=false`` is refused the same settings, in the same words:
it stores them, and a later eval.py starts from them."""

from __future__ import annotations

import copy

import pytest
from cli_runs import TINY
from generated_settings import generated_settings, kept_small
from omegaconf import DictConfig
from refusals import TINY_MQAR

from core.errors import PosGPTError
from evaluation.evaluator import EVALUATORS
from experiment.compose import compose_config
from experiment.config import EvalConfig
from experiment.plan import plan_training
from model.pe.rope_remap import TYPE_SETTINGS, RoPERemapConfig, remap_label
from model.pe.rope_scaling import ROPE_SCALINGS
from training import distributed
from training.loop import _prepare

TEXT = [*TINY, "train.max_steps=1", "train.eval_after=true", "eval.max_tokens=256", "pe=rope"]
TEXT += ["eval.length_multipliers=[1,2]"]
TASK = [*TINY_MQAR, "model.n_layer=1", "model.n_embd=16", "model.n_head=2", "train.batch_size=4", "train.max_steps=1"]
TASK += ["train.eval_after=true", "eval.task_half_width=0.3", "logging.wandb.mode=disabled", "logging.progress=false"]
TASK += ["train.num_threads=1", "eval.length_multipliers=[1,2]"]


def variations() -> list[str]:
    """Every RoPE scaling at factor 2, and every remap at a window of half, one and two times the text run's
    training length (16; the task run's is 32): within it, or past what it was trained on."""
    remaps = [
        remap_label(RoPERemapConfig(type=kind, window=window, group=2 if "group" in needed else None, local_window=2))
        for kind, (needed, _) in TYPE_SETTINGS.items()
        if kind != "none"
        for window in (8, 16, 32)
    ]
    return [f"{kind}:2" for kind in ROPE_SCALINGS if kind != "none"] + remaps


def eval_settings() -> list[tuple[str, ...]]:
    """The generated eval.* settings, every variation, and every evaluator asked for by name."""
    return (
        generated_settings(EvalConfig, "eval.")
        + [(f"eval.variations=[none,{spec}]",) for spec in variations()]
        + [(f"eval.evaluators=[{name}]",) for name in sorted(EVALUATORS)]
        + [("eval.key_tokens=true",)]
    )


SETTINGS = eval_settings()


def test_the_settings_are_generated_from_every_kind_of_field():
    keys = {setting[-1].split("=", 1)[0] for setting in SETTINGS}
    assert {"eval.protocols", "eval.lengths", "eval.stride", "eval.key_tokens", "eval.task_half_width"} <= keys
    assert len(keys) >= 20


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["text", "task"])
def test_an_evaluation_the_plan_accepts_runs_to_its_end(cli, tmp_path, kind):
    base = [*TEXT, f"data.files=[{cli.corpus}]"] if kind == "text" else TASK
    ran = 0
    for number, setting in enumerate(SETTINGS):
        overrides = [*base, *kept_small(setting)]
        run_dir = tmp_path / f"run-{number}"
        cfg = compose_config(overrides)
        without = copy.deepcopy(cfg)
        without.train.eval_after = False
        stored_only = refusal(without, [*overrides, "train.eval_after=false"], run_dir)
        try:
            plan = plan_training(cfg, overrides, run_dir)
        except PosGPTError as error:
            assert stored_only == str(error), f"{setting}: refused only with train.eval_after=true: {error}"
            assert not run_dir.exists(), setting
            continue
        assert stored_only is None, f"{setting}: refused only with train.eval_after=false: {stored_only}"
        try:
            ready = _prepare(plan, run_dir, distributed.DistInfo())
        except PosGPTError:  # refused by the preparation: before any write, as --check refuses it
            assert not run_dir.exists(), setting
            continue
        run_dir.mkdir()
        splits = ready.splits
        try:
            plan.evaluation.run(
                ready.raw_model, run_dir, ready.device, ready.dtype, splits["val"], 0, plan.checkpoint.config, None
            )
        except PosGPTError as error:
            pytest.fail(f"{setting}: planned, then refused by the evaluation after training: {error}")
        ran += 1
    # a task run refuses the language-model runs' settings (read only by them); each kind runs some of them
    assert ran >= (len(SETTINGS) // 3 if kind == "text" else 4), ran


def refusal(cfg: DictConfig, overrides: list[str], run_dir) -> str | None:
    """The training plan's refusal of ``cfg``, composed from ``overrides`` (None: planned)."""
    try:
        plan_training(cfg, overrides, run_dir)
    except PosGPTError as error:
        return str(error)
    return None


def switched_evaluators() -> dict[str, str]:
    """Each language-model evaluator that a switch asks for, and that switch: the selector its own settings are
    read with (core.domain's used_with, as generated_settings puts it before such a setting)."""
    switches = {}
    for name, evaluator in EVALUATORS.items():
        own = [s for s in generated_settings(evaluator.Settings, "eval.") if len(s) == 2]
        if evaluator.runs == "text" and own:
            switches[name] = own[0][0]
    return switches


def plan_outcome(overrides: list[str], run_dir) -> str | None:
    return refusal(compose_config(overrides), overrides, run_dir)


@pytest.mark.parametrize("name, switch", sorted(switched_evaluators().items()))
def test_an_evaluator_named_in_eval_evaluators_reads_what_its_switch_would_have_it_read(cli, tmp_path, name, switch):
    """eval.evaluators=[X] runs X as its switch does: each of X's settings is planned, or refused in the same words,
    either way (a setting refused as unread though X reads it, or a check X's switch alone triggers, fails here)."""
    base = [*TEXT, f"data.files=[{cli.corpus}]"]
    for setting in generated_settings(EVALUATORS[name].Settings, "eval."):
        rest = [override for override in kept_small(setting) if override != switch]
        by_switch = plan_outcome([*base, switch, *rest], tmp_path / "run")
        by_name = plan_outcome([*base, f"eval.evaluators=[{name}]", *rest], tmp_path / "run")
        assert by_name == by_switch, (setting, by_name, by_switch)


def test_a_named_copy_probe_counts_its_span_tokens_in_the_plan(cli, tmp_path):
    """The copy probe's candidate tokens (eval.copy_min_count) are counted when the run is planned, whether eval.tasks
    or eval.evaluators asks for it: too few refuse the training run, not its end."""
    base = [*TEXT, f"data.files=[{cli.corpus}]", f"eval.copy_min_count={10**9}"]
    by_switch = plan_outcome([*base, "eval.tasks=[copy_probe]"], tmp_path / "run")
    by_name = plan_outcome([*base, "eval.evaluators=[copy_probe]"], tmp_path / "run")
    assert by_switch is not None and by_name == by_switch
