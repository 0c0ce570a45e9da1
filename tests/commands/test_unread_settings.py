"""A setting that the run would not read, where that depends on more than a sibling key, is refused at start-up in
one line naming the keys involved (the sinusoid's scale under GPT-2's convention, a hybrid's settings of a scheme
outside its pattern); a fraction that gives no whole number of a head's dimensions is refused, never rounded; and
an evaluation refuses an unread setting only among the keys it sets itself. Through the command lines, in this
process."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runs import assert_one_line_error
from tiny_checkpoint import make_run

from experiment.compose import compose_config
from experiment.config import validate


def refused_before_writing(done, run_dir: Path, *fragments: str) -> None:
    assert_one_line_error(done, *fragments)
    assert not run_dir.exists(), sorted(p.name for p in run_dir.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        # match_tokens scales the sinusoid to the tokens under GPT-2's convention, whatever pe.scale says
        (
            ["pe=sinusoidal", "model.embedding=gpt2", "pe.scale=0.5"],
            ["pe.scale=0.5", "pe.match_tokens=true", "model.embedding=gpt2"],
        ),
        # a hybrid holds every scheme's settings; only those of its pattern are read
        (["pe=hybrid", "pe.kerple.kernel=power"], ["pe.kerple.kernel=power", "pe.pattern=[rope,none]"]),
        (["pe=hybrid", "pe.p_rope.p=0.5"], ["pe.p_rope.p=0.5", "pe.pattern=[rope,none]"]),
        # p d / 2 = 0.3 x 8 / 2 = 1.2 pairs (TINY: head dimension 8): rounded down, it was silently pe.p=0.25
        (["pe=p_rope", "pe.p=0.3"], ["pe.p=0.3", "1.2 of the 4 frequency pairs", "pe.p=0.25 (1 pairs) or 0.5"]),
        (
            ["pe=hybrid", "pe.pattern=[p_rope,none]", "pe.p_rope.p=0.3", "model.n_layer=2"],
            ["pe.p_rope.*", "pe.p=0.3 keeps 1.2"],
        ),
        # 8 x 0.3 = 2.4 coordinates, which int() made 2 and accepted
        (["pe=rope", "pe.rotary_fraction=0.3"], ["pe.rotary_fraction", "x 0.3 = 2.4"]),
    ],
)
def test_a_setting_the_run_would_not_read_or_would_round_is_refused(cli, tmp_path, extra, fragments):
    run_dir = tmp_path / "run"
    refused_before_writing(cli.train_here(run_dir, *extra), run_dir, *fragments)


@pytest.mark.parametrize(
    "extra",
    [
        ["pe=sinusoidal", "model.embedding=gpt2", "pe.scale=0.5", "pe.match_tokens=false"],
        ["pe=sinusoidal", "model.embedding=fairseq", "pe.scale=0.5"],
        ["pe=sinusoidal", "model.embedding=gpt2", "pe.scale=null"],  # asks for the match it gets: read
        ["pe=hybrid", "pe.pattern=[rope,kerple]", "pe.kerple.kernel=power", "pe.rope.base=500000", "model.n_layer=2"],
        ["pe=llama4_inope", "model.n_layer=4"],  # its preset RoPE base is its default, not a setting given
        ["pe=p_rope", "pe.p=0.25"],
        ["pe=rope", "pe.rotary_fraction=0.25"],
    ],
)
def test_settings_the_run_reads_are_accepted(cli, extra):
    validate(compose_config([*cli.overrides(Path("unused"), *extra)]))


@pytest.fixture(scope="module")
def yarn_run(cli, tmp_path_factory) -> Path:
    """A run trained with YaRN and its own beta_fast (a checkpoint, untrained weights: nothing here needs more)."""
    run = tmp_path_factory.mktemp("yarn") / "run"
    yarn = ("pe.scaling.type=yarn", "pe.scaling.factor=2", "pe.scaling.beta_fast=16")
    return make_run(run, cli.corpus, "pe=rope", *yarn)


EVAL = ("pe.scaling.type=none", "pe.scaling.factor=1", "eval.lengths=[16]", "eval.protocols=[nonoverlapping]")


def test_an_evaluation_without_the_trained_scaling_is_not_refused_for_its_settings(cli, yarn_run):
    """The trained beta_fast is unread under pe.scaling.type=none, but it was read in training: not the user's."""
    done = cli.eval_here(yarn_run, *EVAL)
    assert done.returncode == 0, done.stderr
    assert (yarn_run / "eval" / "extrapolation.json").is_file()


def test_an_evaluation_refuses_an_unread_setting_it_sets(cli, yarn_run):
    done = cli.eval_here(yarn_run, *EVAL, "pe.scaling.beta_slow=2")
    assert_one_line_error(done, "pe.scaling.beta_slow=2.0", "pe.scaling.type=none ignores it")


# Settings of one kind of run given to the other (core.domain's runs): a task run has no perplexity protocols, a
# language-model run no task grid. Each is read by a run of the other kind only, so it would change nothing here.
OTHER_KIND = [
    (["task=passkey", "eval.protocols=[sliding]"], "eval.protocols=[sliding] is read only by a language-model run"),
    (["task=passkey", "eval.stride=8"], "eval.stride=8 is read only by a language-model run"),
    (["task=passkey", "eval.max_tokens=100"], "eval.max_tokens=100 is read only by a language-model run"),
    (["task=passkey", "eval.per_position_plot_lengths=[16]"], "eval.per_position_plot_lengths=[16] is read only"),
    (
        ["task=mqar", "train.seq_len=32", "eval.lengths=[32]", "eval.task_depths=[0.5]"],
        "task=mqar has no depth to vary",
    ),
    (["eval.task_half_width=0.1"], "eval.task_half_width=0.1 is read only by a task run or the probes"),
    (["eval.task_threshold=0.5"], "eval.task_threshold=0.5 is read only by a task run or the probes"),
    (["eval.task_depths=[0.5]"], "eval.task_depths=[0.5] is read only by a task run"),
    (["eval.random_positions=true"], "eval.random_positions=true is read only by a task run"),
]


@pytest.mark.parametrize(("extra", "fragment"), OTHER_KIND)
def test_a_setting_only_the_other_kind_of_run_reads_is_refused_before_training(cli, tmp_path, extra, fragment):
    run_dir = tmp_path / "run"
    refused_before_writing(cli.train_here(run_dir, *extra), run_dir, fragment)


@pytest.fixture(scope="module")
def passkey_run(cli, tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("passkey") / "run", cli.corpus, "task=passkey", "train.seq_len=32")


def test_an_evaluation_of_a_task_run_refuses_perplexity_settings_and_keeps_the_run_as_it_was(cli, passkey_run):
    files = {path: path.read_bytes() for path in passkey_run.rglob("*") if path.is_file()}
    done = cli.eval_here(passkey_run, "eval.protocols=[nonoverlapping]")
    assert_one_line_error(done, "eval.protocols=[nonoverlapping] is read only by a language-model run", "task=passkey")
    assert {path: path.read_bytes() for path in passkey_run.rglob("*") if path.is_file()} == files


def test_the_settings_each_kind_of_run_reads_are_accepted(cli):
    """The same keys, each given to a run of the kind that reads it, and an empty depth grid to any task."""
    for extra in (
        ["eval.protocols=[sliding]", "eval.stride=8", "eval.max_tokens=100", "eval.lengths=[16]"],
        ["task=passkey", "eval.task_half_width=0.1", "eval.task_depths=[0.5]", "eval.task_threshold=0.5"],
        ["task=mqar", "train.seq_len=64", "eval.task_depths=[]"],
        ["eval.tasks=[copy_probe]", "eval.task_half_width=0.3", "eval.task_threshold=0.5"],  # the probe's
    ):
        validate(compose_config([*cli.overrides(Path("unused"), *extra)]))
