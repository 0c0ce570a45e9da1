"""The commands that read a trained run plan all of it first: for eval.py, sample.py and scripts/inspect_attention.py,
every setting of the sections each reads, generated from the schema (tests/support/generated_settings.py: each
declared choice, a flipped switch, each numeric domain's edge, beside the setting it is read with), on every kind of
run the command takes (text, a task, one trained with stored variations as scripts/study.sh trains it, a hybrid, a
fine-tuned run): either the command's plan refuses it, and the run's tree is byte for byte as it was, or the planned
command runs to its end. A refusal that comes after the plan, when the command may already have written, fails here.

The commands run in this process, through the functions their mains call (plan, then run), on untrained tiny runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_runs import load_script
from generated_settings import eval_time_settings, generated_settings, kept_small
from refusals import INSPECT, tree
from tiny_checkpoint import make_run

import eval as eval_command
import sample as sample_command
from core.errors import PosGPTError
from experiment.config import EvalConfig, InspectConfig, SampleConfig
from model.pe.rope_remap import RoPERemapConfig
from model.pe.rope_scaling import RoPEScalingConfig

inspect_command = load_script("inspect_attention")
SCALING = generated_settings(RoPEScalingConfig, "pe.scaling.")
REMAP = generated_settings(RoPERemapConfig, "pe.remap.")


@dataclasses.dataclass(frozen=True)
class Command:
    """A command that reads a run: its plan, what runs the plan, and the settings it is given besides the generated
    ones, by kind of run (small and fast)."""

    plan: Callable[[Path, list[str]], Any]
    run: Callable[[Any], None]
    base: dict[str, tuple[str, ...]]


COMMANDS = {
    "eval": Command(
        eval_command.plan_evaluation,
        eval_command.evaluate,
        {
            "text": ("eval.max_tokens=256", "eval.length_multipliers=[1,2]"),
            "task": ("eval.task_half_width=0.3", "eval.length_multipliers=[1,2]", "eval.task_depths=[0.5]"),
        },
    ),
    "sample": Command(sample_command.plan_sampling, sample_command.sample, {"text": ("sample.max_new_tokens=4",)}),
    "inspect": Command(inspect_command.plan_inspection, inspect_command.inspect_run, {"text": INSPECT}),
}
# The kinds of run, as their checkpoints record them (tiny_checkpoint.make_run): text, a task, one trained with
# stored variations as scripts/study.sh trains every RoPE run, and one fine-tuned from a parent (whose original
# length the scalings read), and a hybrid, whose layers' schemes hold their evaluation-time settings under
# pe.<scheme>.
RUNS = {
    "text": ("pe=rope",),
    "passkey": ("pe=rope", "task=passkey", "train.seq_len=32"),
    "stored-variations": ("pe=rope", "eval.variations=[none,yarn:2]"),
    "fine-tuned": ("pe=rope", "train.init_from=/runs/parent", "train.init_from_pe=keep"),
    "hybrid": ("pe=hybrid", "model.n_layer=2"),  # its pattern: rope, none
}
TASK_RUNS = ("passkey",)
EVAL, SAMPLE = generated_settings(EvalConfig, "eval."), generated_settings(SampleConfig, "sample.")
INSPECTION = generated_settings(InspectConfig, "inspect.")
HYBRID = eval_time_settings("hybrid")  # every scheme a pattern may hold: those of no layer of the run too
# (command, kind of run, the settings generated for it): each command's own sections on a plain run; the scheme's
# evaluation-time settings, which a stored value must give way to, on every text run a command takes
CASES = [
    ("eval", "text", [*EVAL, *SCALING, *REMAP]),
    ("eval", "passkey", EVAL),
    ("eval", "stored-variations", [*SCALING, *REMAP]),
    ("eval", "fine-tuned", SCALING),
    ("sample", "text", [*SAMPLE, *SCALING]),
    ("sample", "stored-variations", SCALING),
    ("inspect", "text", [*INSPECTION, *SCALING, *REMAP]),
    ("inspect", "stored-variations", SCALING),
    ("eval", "hybrid", HYBRID),  # (sample.py and inspect plan a run's scheme settings as eval.py does)
]


def test_the_settings_are_generated_from_every_section_a_command_reads():
    sections = {setting[-1].split("=", 1)[0].rsplit(".", 1)[0] for _, _, settings in CASES for setting in settings}
    assert {"eval", "sample", "inspect", "pe.scaling", "pe.remap", "pe.rope.scaling", "pe.rope.remap"} <= sections
    assert len(EVAL) >= 20 and len(SCALING) >= 8 and len(REMAP) >= 4


@pytest.mark.slow
@pytest.mark.parametrize("command, run, settings", CASES, ids=[f"{command}:{run}" for command, run, _ in CASES])
def test_a_setting_the_plan_accepts_runs_to_its_end_and_one_it_refuses_leaves_the_run_as_it_was(
    cli, tmp_path, command, run, settings
):
    run_dir = make_run(tmp_path / "run", cli.corpus, *RUNS[run])
    reader = COMMANDS[command]
    ran = refused = 0
    for setting in settings:
        overrides = [*reader.base["task" if run in TASK_RUNS else "text"], *kept_small(setting)]
        before = tree(run_dir)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                plan = reader.plan(run_dir, overrides)
        except PosGPTError as error:
            assert "\n" not in str(error), (setting, str(error))
            assert tree(run_dir) == before, f"{setting}: refused after writing: {error}"
            refused += 1
            continue
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), torch.no_grad():
                reader.run(plan)  # as the command runs it: without gradients
        except PosGPTError as error:
            pytest.fail(f"{command}.py {run} {' '.join(setting)}: planned, then refused as it ran: {error}")
        ran += 1
    assert ran >= 3 and refused >= 1, (ran, refused)  # the walk met both answers
