"""The end-of-training evaluation is planned with the run: for every ``eval.*`` setting, generated from the schema
(tests/support/generated_settings.py: each declared choice, a flipped switch, each numeric domain's bound), on a
language-model run and on a task run, either the training plan refuses it (train.py and ``train.py --check``
alike, before any write: the planning writes nothing) or the evaluation the plan holds runs to its end on the model
the run starts from. A refusal of the evaluation after training, which would come after the run's checkpoint was
written, fails here."""

from __future__ import annotations

import pytest
from cli_runs import TINY
from generated_settings import generated_settings, kept_small
from refusals import TINY_MQAR

from core.errors import PosGPTError
from experiment.compose import compose_config
from experiment.config import EvalConfig
from experiment.plan import plan_training
from training import distributed
from training.loop import _prepare

TEXT = [*TINY, "train.max_steps=1", "train.eval_after=true", "eval.max_tokens=256", "pe=rope"]
TEXT += ["eval.length_multipliers=[1,2]"]
TASK = [*TINY_MQAR, "model.n_layer=1", "model.n_embd=16", "model.n_head=2", "train.batch_size=4", "train.max_steps=1"]
TASK += ["train.eval_after=true", "eval.task_half_width=0.3", "logging.wandb.mode=disabled", "logging.progress=false"]
TASK += ["train.num_threads=1", "eval.length_multipliers=[1,2]"]


def eval_settings() -> list[tuple[str, ...]]:
    return generated_settings(EvalConfig, "eval.") + [
        ("eval.variations=[none,yarn:2]",),
        ("eval.variations=[none,rerope:8]",),
        ("eval.key_tokens=true",),
    ]


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
        try:
            plan = plan_training(compose_config(overrides), overrides, run_dir)
            ready = _prepare(plan, run_dir, distributed.DistInfo())
        except PosGPTError:  # refused by the plan or the preparation: before any write, as --check refuses it
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
