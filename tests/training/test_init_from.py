"""Context extension by fine-tuning (train.init_from, training/init_from.py): a child run starts from its
parent's weights and nothing else, keeps the parent's architecture and RoPE's original length L."""

import json

import pytest
import torch
from cli_runs import assert_user_error

from core.errors import PosGPTError
from core.tracking import read_metrics
from model import GPT, ModelConfig
from model.pe import ModelDims
from model.pe.learned import LearnedConfig
from model.pe.rope import RoPEConfig, RotaryPositionalEncoding
from model.pe.rope_scaling import RoPEScalingConfig
from training.init_from import Parent

HEAD_DIM, PARENT_LEN, CHILD_LEN = 16, 64, 256


def rope(train_len, scaling):
    dims = ModelDims(n_embd=4 * HEAD_DIM, n_head=4, head_dim=HEAD_DIM, train_seq_len=train_len, init_std=0.02)
    return RotaryPositionalEncoding(RoPEConfig(scaling=scaling), dims)


@pytest.mark.parametrize("kind", ["linear", "yarn", "dynamic_ntk"])
def test_extended_frequencies_are_the_parents_under_the_same_scaling(kind):
    """A model trained at 64 and extended to 256 with factor 4 computes what its parent computes with that scaling."""
    positions = torch.arange(2 * CHILD_LEN)
    parent = rope(PARENT_LEN, RoPEScalingConfig(kind, 4.0))
    child = rope(CHILD_LEN, RoPEScalingConfig(kind, 4.0, original_seq_len=PARENT_LEN))
    for seq_len in (CHILD_LEN, 2 * CHILD_LEN):
        for got, want in zip(child.cos_sin(positions, seq_len), parent.cos_sin(positions, seq_len)):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    if kind != "linear":  # L matters to yarn's ramp and dynamic NTK's threshold: without it they would differ
        forgetful = rope(CHILD_LEN, RoPEScalingConfig(kind, 4.0))
        assert not torch.equal(
            forgetful.cos_sin(positions, 2 * CHILD_LEN)[0], parent.cos_sin(positions, 2 * CHILD_LEN)[0]
        )


def test_a_learned_table_cannot_be_extended():
    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=100)
    parent = GPT(cfg, LearnedConfig(), train_seq_len=16)
    child = GPT(cfg, LearnedConfig(), train_seq_len=32)
    with pytest.raises(PosGPTError, match=r"pe.table.weight has shape \[16, 16\] .* cannot be extended"):
        Parent("parent", 10, 16, parent.state_dict()).load_into(child, 32)


# --- Through the CLI (in-process, cli.train_here): a tiny RoPE parent at 16 tokens, a child at 32 with YaRN -------

EVAL = ["eval.max_tokens=128", "eval.length_multipliers=[1,2]", "eval.protocols=[nonoverlapping]"]


@pytest.fixture(scope="module")
def parent_run(cli):
    run_dir = cli.base / "init-from-parent"
    if not (run_dir / "checkpoints" / "last.pt").exists():
        done = cli.train_here(run_dir, "pe=rope", "train.max_steps=20")
        assert done.returncode == 0, done.stderr
    return run_dir


@pytest.fixture(scope="module")
def child_run(cli, parent_run):
    """One step at a learning rate (1e-30) below float32's resolution: the saved weights are the starting ones."""
    run_dir = cli.base / "init-from-child"
    done = cli.train_here(
        run_dir,
        "pe=rope",
        f"train.init_from={parent_run}",
        "train.seq_len=32",
        "train.max_steps=1",
        "train.lr=1e-30",
        "pe.scaling.type=yarn",
        "pe.scaling.factor=2",
        "train.eval_after=true",
        *EVAL,
    )
    assert done.returncode == 0, done.stderr
    return run_dir


@pytest.mark.slow
def test_child_starts_from_the_parents_weights_and_nothing_else(parent_run, child_run):
    parent = torch.load(parent_run / "checkpoints" / "last.pt", weights_only=True)
    child = torch.load(child_run / "checkpoints" / "last.pt", weights_only=True)
    assert child["model"].keys() == parent["model"].keys()
    for name, tensor in parent["model"].items():
        torch.testing.assert_close(child["model"][name], tensor, rtol=0, atol=1e-20, msg=name)
    assert child["step"] == 1 and parent["step"] == 20  # its own step and schedule, from 0
    assert {s["step"].item() for s in child["optimizer"]["state"].values()} == {1.0}  # fresh AdamW moments
    recorded = child["config"]
    assert recorded["train"]["init_from"] == str(parent_run.resolve()) and recorded["train"]["seq_len"] == 32
    assert recorded["pe"]["scaling"]["original_seq_len"] == 16  # the parent's length, filled in
    assert read_metrics(child_run)[0] == {
        "step": 0,
        "init_from": str(parent_run.resolve()),
        "parent_step": 20,
        "parent_seq_len": 16,
        "parent_pe": "rope",
    }


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["none", "learned"])
def test_a_child_may_replace_its_parents_scheme_which_then_starts_afresh(cli, parent_run, scheme):
    """train.init_from_pe=replace (DroPE: a RoPE parent, its rotation dropped): every weight but the scheme's is the
    parent's; the new scheme's parameters (a learned table) start from their initialisation."""
    run_dir = cli.base / f"init-from-replaced-{scheme}"
    overrides = [f"pe={scheme}", f"train.init_from={parent_run}", "train.init_from_pe=replace"]
    done = cli.train_here(run_dir, *overrides, "train.max_steps=1", "train.lr=1e-30")
    assert done.returncode == 0, done.stderr
    parent = torch.load(parent_run / "checkpoints" / "last.pt", weights_only=True)["model"]
    child = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert set(child["model"]) - set(parent) == ({"pe.table.weight"} if scheme == "learned" else set())
    for name, tensor in parent.items():
        torch.testing.assert_close(child["model"][name], tensor, rtol=0, atol=1e-20, msg=name)
    assert child["config"]["pe"]["name"] == scheme and read_metrics(run_dir)[0]["parent_pe"] == "rope"
    refused = cli.train_here(cli.base / "init-from-kept", f"pe={scheme}", f"train.init_from={parent_run}")
    assert_user_error(refused, "unless train.init_from_pe=replace")


def test_replacing_a_scheme_needs_a_parent(cli, tmp_path):
    done = cli.train_here(tmp_path / "run", "pe=none", "train.init_from_pe=replace")
    assert_user_error(done, "train.init_from_pe=replace", "set train.init_from")
    assert_user_error(
        cli.train_here(tmp_path / "run", "train.init_from_pe=swap"),
        "train.init_from_pe='swap' is not one of its choices: keep, replace",
    )


@pytest.mark.slow
def test_child_evaluation_measures_the_extended_model(cli, child_run):
    """At the end of training, lengths relative to the new seq_len; eval.py later scores the same model."""
    document = json.loads((child_run / "eval" / "extrapolation.json").read_text())
    assert document["train_seq_len"] == 32
    rows = {row["length"]: row for row in document["results"]}
    assert sorted(rows) == [32, 64]
    assert all(
        row["variation_settings"]["scaling"]["type"] == "yarn"
        and row["variation_settings"]["scaling"]["original_seq_len"] == 16
        for row in rows.values()
    )
    done = cli.eval_here(child_run, *EVAL)
    assert done.returncode == 0, done.stderr
    again = json.loads((child_run / "eval" / "extrapolation.json").read_text())
    assert {row["length"]: row["ppl"] for row in again["results"]} == {n: row["ppl"] for n, row in rows.items()}


@pytest.mark.slow
@pytest.mark.parametrize(
    "parent, overrides, message",
    [
        ("rope", ["pe=rope", "model.n_embd=32"], "train.init_from: model.n_embd=16 in"),
        ("learned", ["train.seq_len=32"], "pe.table.weight has shape [16, 16]"),
    ],
)
def test_another_architecture_is_refused(cli, reference, parent_run, tmp_path, parent, overrides, message):
    source = parent_run if parent == "rope" else reference
    done = cli.train_here(tmp_path / "child", f"train.init_from={source}", "train.max_steps=1", *overrides)
    assert_user_error(done, message)
