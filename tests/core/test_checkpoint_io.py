"""A checkpoint that contradicts itself or lost a weight is refused in one line by every command that loads it.

core.checkpoint_io.check_weights is the one check: every parameter of the model the checkpoint's config describes
must be there with its shape and finite values, and nothing else. eval.py, sample.py, scripts/inspect_attention.py,
a resume (train.resume=true) and a parent (train.init_from) all go through it, so a config edited after training, a
file copied from another run, a weight gone missing or damaged ends in ``error: ...`` naming the first parameter that
does not fit (and both shapes), exit 2, before anything is written. Before, the first three ended in load_state_dict's
traceback and a resume trained on, the missing weight left at its fresh initialisation. A resume also needs the
training state beside the weights (training.checkpointing.RESUME_STATE).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import torch
from cli_runs import STEPS, assert_one_line_error

from core.checkpoint_io import WeightsMismatch, check_weights, last_checkpoint_path, load_checkpoint
from core.errors import PosGPTError

FIRST = "pe.table.weight"  # the first parameter, in the model's order, whose shape follows model.n_embd (pe=learned)


def expected() -> dict[str, torch.Tensor]:
    return {"a.weight": torch.zeros(4, 2), "b.bias": torch.zeros(3)}


@pytest.mark.parametrize(
    "weights, message",
    [
        ({"b.bias": torch.zeros(3)}, r"^checkpoint x is incomplete: it has no a.weight \(shape \[4, 2\] in the model"),
        ({"a.weight": [1], "b.bias": torch.zeros(3)}, r"it holds a list as a.weight"),
        (
            {"a.weight": torch.zeros(2, 4), "b.bias": torch.zeros(3)},
            r"a.weight has shape \[2, 4\] in the checkpoint but \[4, 2\] in the model",
        ),  # noqa: E501
        ({**expected(), "c.weight": torch.zeros(1)}, r"it holds c.weight, which the model has not"),
        (
            {"a.weight": torch.zeros(4, 2), "b.bias": torch.tensor([0.0, float("inf"), 0.0])},
            r"^checkpoint x is damaged: b.bias holds NaN or infinite values; nothing was loaded",
        ),
    ],
    ids=["missing", "not a tensor", "shape", "unexpected", "not finite"],
)
def test_check_weights_names_the_first_parameter_that_does_not_fit(weights, message):
    with pytest.raises(WeightsMismatch, match=message):
        check_weights(expected(), weights, "x")
    check_weights(expected(), expected(), "x")  # a whole, fitting checkpoint passes


def damage(run: Path, how: str) -> str:
    """Damage the checkpoint of ``run`` in place; the line the refusal must hold."""
    path = last_checkpoint_path(run)
    state = torch.load(path, weights_only=True)
    if how == "a weight missing":
        name = list(state["model"])[-1]
        shape = list(state["model"].pop(name).shape)
        fragment = f"checkpoint {path} is incomplete: it has no {name} (shape {shape} in the model"
    elif how == "config that no longer fits":
        state["config"]["model"]["n_embd"] = 32  # as if edited after training: the weights are 16 wide
        shape = list(state["model"][FIRST].shape)
        fragment = (
            f"checkpoint {path} does not fit the model its config describes: {FIRST} has shape {shape} in the "
            f"checkpoint but {[shape[0], 32]} in the model"
        )
    elif how == "a NaN weight":
        name = list(state["model"])[0]
        state["model"][name].view(-1)[0] = float("nan")
        fragment = f"checkpoint {path} is damaged: {name} holds NaN or infinite values; nothing was loaded"
    else:
        state["model"]["blocks.7.extra.weight"] = torch.zeros(2)
        fragment = f"checkpoint {path} does not fit the model its config describes: it holds blocks.7.extra.weight"
    torch.save(state, path)
    return fragment


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }  # noqa: E501


DAMAGES = ["a weight missing", "config that no longer fits", "an unexpected weight", "a NaN weight"]


@pytest.mark.parametrize(
    "key, value", [("step", "twenty"), ("step", -3), ("step", True), ("format_version", 1.0), ("format_version", None)]
)
def test_a_checkpoint_whose_counts_are_not_counts_is_refused(tmp_path, key, value):
    """An edited step was printed and recorded in every row as the run's training steps, with exit 0."""
    state = {"model": {}, "step": 20, "config": {}, "format_version": 1, key: value}
    path = tmp_path / "last.pt"
    torch.save(state, path)
    with pytest.raises(PosGPTError, match=rf"^{path} is not a posgpt checkpoint \(its {key} is {value!r}, not a count"):
        load_checkpoint(path)


@pytest.mark.slow  # the reference run trains once per session
@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("command", ["eval.py", "sample.py", "scripts/inspect_attention.py"])
def test_a_run_whose_checkpoint_does_not_fit_is_refused(cli, reference, tmp_path, command, how):
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    fragment = damage(run, how)
    before = digest(run)
    short = ["sample.max_new_tokens=2"] if command == "sample.py" else []
    assert_one_line_error(cli.here(command, f"run_dir={run}", *short), fragment)
    assert digest(run) == before


@pytest.mark.slow
@pytest.mark.parametrize("how", DAMAGES)
def test_a_resume_from_a_checkpoint_that_does_not_fit_is_refused(cli, reference, tmp_path, how):
    """A weight missing trained on, from its fresh initialisation, with exit 0."""
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    fragment = damage(run, how)
    before = digest(run)
    width = ["model.n_embd=32"] if how == "config that no longer fits" else []  # the resume's own settings
    done = cli.train_here(run, "train.resume=true", f"train.max_steps={STEPS + 2}", *width)
    assert_one_line_error(done, fragment)
    assert digest(run) == before


@pytest.mark.slow
@pytest.mark.parametrize("how", DAMAGES)
def test_a_parent_that_does_not_fit_is_refused(cli, reference, tmp_path, how):
    parent = tmp_path / "parent"
    shutil.copytree(reference, parent)
    fragment = damage(parent, how)
    width = ["model.n_embd=32"] if how == "config that no longer fits" else []  # the parent's recorded settings
    done = cli.train_here(tmp_path / "child", f"train.init_from={parent}", "train.max_steps=1", *width)
    assert_one_line_error(done, f"train.init_from: {fragment}")
    assert not (tmp_path / "child").exists()


@pytest.mark.slow
@pytest.mark.parametrize("lacking", ["optimizer", "sampler_state"])
def test_a_resume_from_weights_alone_is_refused(cli, reference, tmp_path, lacking):
    """A checkpoint that holds what evaluation needs but not the training state (a slimmed copy): KeyError's
    traceback, after the run's record had been rewritten."""
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    path = last_checkpoint_path(run)
    state = torch.load(path, weights_only=True)
    del state[lacking]
    torch.save(state, path)
    before = digest(run)
    done = cli.train_here(run, "train.resume=true", f"train.max_steps={STEPS + 2}")
    assert_one_line_error(done, f"cannot resume {run}: {path} holds no {lacking} state", f"train.init_from={run}")
    assert digest(run) == before
