"""Values that each key's own domain accepts but that break the arithmetic together with another key or with the
data: each is refused at start-up, in one line naming both keys, exit code 2, before anything is written; and
each command's boundary values inside the domain compute a result. Every case runs through the real command
line (in this process, as ``python <script> <argv>`` runs it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cli_runs import REPO, assert_one_line_error, load_script
from generated_options import parser_of

import training.loop


def refused_before_writing(done, run_dir: Path, *fragments: str) -> None:
    assert_one_line_error(done, *fragments)
    assert not run_dir.exists(), sorted(p.name for p in run_dir.iterdir())


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        # the default corpus's ids reach 50256: an IndexError at the first step, or, on a corpus whose ids happen
        # to be smaller, a perplexity over a vocabulary that cannot represent the tokenizer's output
        (["model.vocab_size=1000"], ["model.vocab_size=1000", "data.name=text", "50257"]),
        (["model.vocab_size=1"], ["model.vocab_size=1", "at least 50257"]),
        # a task sets the vocabulary itself: a value given for the run would be ignored
        (["task=passkey", "model.vocab_size=1000"], ["model.vocab_size=1000", "task=passkey"]),
    ],
)
def test_a_vocabulary_smaller_than_the_datas_is_refused(cli, tmp_path, extra, fragments):
    run_dir = tmp_path / "run"
    refused_before_writing(cli.train_here(run_dir, *extra), run_dir, *fragments)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        # a non-null default, given under a type that never reads it: the run would equal one without it
        (["pe=rope", "pe.scaling.beta_fast=16"], ["pe.scaling.beta_fast=16.0", "pe.scaling.type=yarn"]),
        (["pe=rope", "pe.scaling.type=ntk", "pe.scaling.factor=2", "pe.scaling.beta_slow=2"], ["pe.scaling.type=ntk"]),
        (["model.attn_temperature.attn_scale=0.2"], ["attn_scale=0.2", "model.attn_temperature.type=llama4"]),
        (["eval.streaming_sinks=2"], ["eval.streaming_sinks=2", "eval.protocols holds streaming"]),
        (["eval.copy_span=4"], ["eval.copy_span=4", "eval.tasks holds copy_probe"]),
        # a data source's own keys under another source (these runs read local files: data.source=text)
        (["data.streaming=true"], ["data.streaming=true is read only when data.source=hub", "data.source=text"]),
        (["data.hub_split=validation"], ["data.hub_split=validation", "data.source=hub"]),
        # a null default too, where the run's type (none) holds it for variations that do not read it
        (["pe=rope", "pe.scaling.low_freq_factor=2"], ["low_freq_factor=2.0", "pe.scaling.type=llama3"]),
        (["pe=rope", "pe.scaling.beta_fast=16", "eval.variations=[none,ntk:4]"], ["pe.scaling.beta_fast=16.0"]),
        (["pe=hybrid", "pe.rope.scaling.beta_fast=16"], ["pe.rope.scaling.beta_fast=16.0"]),
        (["data.max_documents=5"], ["data.max_documents=5", "data.source=hub"]),
        # FlexAttention's kernel options where it never runs
        (["model.attn_backend=sdpa", "+model.flex_kernel_options.BLOCK_M=32"], ["model.attn_backend=sdpa ignores"]),
    ],
)
def test_a_setting_its_type_ignores_is_refused(cli, tmp_path, extra, fragments):
    run_dir = tmp_path / "run"
    refused_before_writing(cli.train_here(run_dir, *extra), run_dir, "ignores it", *fragments)


def test_a_setting_read_by_an_evaluation_variation_is_accepted(cli, tmp_path):
    """Type none holds the settings of eval.variations' entries: YaRN's betas for a yarn entry."""
    run_dir = tmp_path / "run"
    done = cli.train_here(
        run_dir, "pe=rope", "pe.scaling.beta_fast=16", "eval.variations=[none,yarn:4]", "train.max_steps=1"
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        # each was refused only where the value is used: after the run directory was written, or after training
        (["pe=learned", "pe.max_positions=8"], ["pe.max_positions=8", "train.seq_len=16"]),
        (["task=passkey", "eval.lengths=[4,16]", "train.eval_after=true"], ["evaluation lengths [4]", "task=passkey"]),
        # each step scaled every decayed weight by 1 - lr x weight_decay < 0: a perplexity of inf, with exit 0
        (["train.lr=1e-3", "train.weight_decay=1e10"], ["train.lr=0.001 x train.weight_decay=10000000000.0"]),
        # a val split shorter than twice every evaluation length: trained, then wrote an all-n/a table, exit 0
        (["train.eval_after=true", "eval.lengths=[4096]", "eval.max_tokens=4096"], ["would score nothing", "4096"]),
        # a probe longer than every length would write an empty result and exit 0
        (
            ["train.eval_after=true", "eval.tasks=[copy_probe]", "eval.copy_span=200"],
            ["eval.copy_span=200", "the longest is 128"],
        ),
    ],
)
def test_what_is_known_before_the_first_step_is_checked_before_it(cli, tmp_path, extra, fragments):
    run_dir = tmp_path / "run"
    refused_before_writing(cli.train_here(run_dir, *extra), run_dir, *fragments)


@pytest.mark.slow  # runs a command on a trained run
def test_an_evaluation_that_would_produce_nothing_is_refused(cli, reference):
    before = sorted(p.name for p in (reference / "eval").iterdir()) if (reference / "eval").exists() else []
    done = cli.eval_here(reference, "eval.tasks=[copy_probe]", "eval.copy_span=64", "eval.lengths=[16,64]")
    assert_one_line_error(done, "eval.copy_span=64", "the longest is 64")
    after = sorted(p.name for p in (reference / "eval").iterdir()) if (reference / "eval").exists() else []
    assert after == before


def test_a_setting_only_another_command_reads_is_refused_before_any_work(cli, reference, tmp_path):
    """eval.*, sample.* and inspect.* belong to the commands that read them (the schema's commands,
    experiment/config.py): given to another, each is one line naming the key and its readers, before anything is
    loaded, trained or written, where it was accepted and changed nothing."""
    cases = [
        ("eval.py", f"run_dir={reference}", "sample.temperature=0.5", "eval.py does not read sample.temperature (read"),
        ("sample.py", f"run_dir={reference}", "eval.lengths=[16]", "(read by train.py and eval.py)"),
        ("scripts/inspect_attention.py", f"run_dir={reference}", "eval.lengths=[64]", "inspect_attention.py does not"),
        ("sample.py", f"run_dir={reference}", "inspect.windows=2", "(read by scripts/inspect_attention.py)"),
    ]
    before = sorted(p.name for p in reference.rglob("*"))
    for script, run, override, fragment in cases:
        assert_one_line_error(cli.here(script, run, override), override.split("=")[0], fragment)
    assert sorted(p.name for p in reference.rglob("*")) == before
    run_dir = tmp_path / "run"
    refused_before_writing(
        cli.train_here(run_dir, "sample.top_k=5"), run_dir, "train.py does not read sample.top_k (read by sample.py)"
    )


def test_a_sweep_with_one_invalid_value_trains_no_job(cli, tmp_path):
    """The invalid job is the second: without the check the first would train (and keep its run directory)."""
    sweep_dir = tmp_path / "sweep"
    args = [*cli.overrides(tmp_path / "unused"), f"hydra.sweep.dir={sweep_dir}", "train.max_steps=1"]
    done = cli.here("train.py", "-m", *args, "train.lr=1e-3,-1")
    assert_one_line_error(done, "job 1 of the sweep (train.lr=-1)", "train.lr=-1.0 is out of its domain")
    assert not sweep_dir.exists()


def test_an_unresolvable_interpolation_is_only_posgpts_line(cli, tmp_path):
    """Hydra printed 'Error executing job with overrides: [...]' before it."""
    run_dir = tmp_path / "run"
    refused_before_writing(cli.train_here(run_dir, "train.lr=${no.such.key}"), run_dir, "no.such.key")


@pytest.mark.parametrize(
    ("script", "args", "message"),
    [
        # estimate.py printed a negative scoring memory for a negative length, and skipped it at 0, with exit 0
        ("scripts/estimate.py", ["--eval-length", "-5"], "argument --eval-length: -5 is out of its domain [1, inf)"),
        ("scripts/estimate.py", ["--eval-length", "0"], "argument --eval-length: 0 is out of its domain [1, inf)"),
        ("scripts/speed.py", ["--warmup", "-1"], "argument --warmup: -1 is out of its domain [0, inf)"),
        ("scripts/speed.py", ["--eval-steps", "0"], "argument --eval-steps: 0 is out of its domain [1, inf)"),
        ("scripts/speed_nanogpt.py", ["--model-py", "x", "--seq-len", "0"], "argument --seq-len: 0 is out of its"),
    ],
)
def test_a_scripts_own_options_are_checked_against_their_domain(cli, script, args, message):
    assert_one_line_error(cli.here(script, *args), message)


def study(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/study.sh", *args], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_study_list_refuses_a_scheme_that_does_not_exist(tmp_path):
    """It listed <dir>/fourier-s1 with exit 0."""
    done = study("--schemes", "rope,fourier", "--list", str(tmp_path / "study"))
    assert_one_line_error(done, "--schemes takes schemes of configs/pe/", "got 'fourier'")
    assert done.stdout == ""


def test_study_a_directory_it_cannot_make_is_one_line(tmp_path):
    """mkdir's own message and exit code 1 before; a path through a file is a mistake in the command (2)."""
    (tmp_path / "file").write_text("")
    done = study("--schemes", "rope", "--seeds", "1", str(tmp_path / "file" / "study"))
    assert_one_line_error(
        done, f"the study directory {tmp_path / 'file' / 'study'} lies under {tmp_path / 'file'}, which is a file"
    )


def test_a_model_whose_training_state_does_not_fit_in_memory_is_refused(cli, tmp_path, monkeypatch):
    """Gradients and AdamW's two states, 12 bytes a parameter on the CPU: a size inside its domain (pe.npos=2**27
    at the default model) built, then was killed by the system at the first step, with no line."""
    monkeypatch.setattr(training.loop, "available_bytes", lambda: 1000)  # what the system says it has left
    run_dir = tmp_path / "run"
    done = cli.train_here(run_dir)
    refused_before_writing(done, run_dir, "parameters: training it needs", "this machine has 0.0 GiB available")


# Each option of scripts/study.sh that takes a value, from the parser that declares them (scripts/study_check.py)
STUDY_VALUE_OPTIONS = [
    action.option_strings[-1]
    for action in parser_of(load_script("study_check").parse_args)._actions
    if action.option_strings and action.nargs != 0 and action.dest not in ("help", "plan_to")
]


@pytest.mark.parametrize("option", STUDY_VALUE_OPTIONS)
def test_study_an_option_without_its_value_is_one_line_and_makes_nothing(tmp_path, option):
    """Each option that takes a value, given none, last or before another option: it was "$2: unbound variable",
    exit 1."""
    for argv in ([option], [option, "--list", str(tmp_path / "study")]):
        assert_one_line_error(study(*argv), f"argument {option}: expected one argument")
    assert not (tmp_path / "study").exists()


def test_study_seeds_given_twice_is_refused_not_half_read(tmp_path):
    """--seed-list gives the seeds, so a --seeds beside it would be ignored: refused, nothing listed or made."""
    done = study("--seeds", "2", "--seed-list", "1,2", "--list", str(tmp_path / "study"))
    assert_one_line_error(done, "--seeds is not read when --seed-list gives the seeds")
    assert done.stdout == "" and not (tmp_path / "study").exists()


def test_study_reads_its_options_from_its_parser():
    assert {"--seeds", "--seed-list", "--schemes", "--tasks"} <= set(STUDY_VALUE_OPTIONS)


@pytest.mark.slow
def test_study_refused_for_an_override_leaves_no_folder(tmp_path):
    done = study("--schemes", "rope", "--seeds", "1", str(tmp_path / "new" / "study"), "train.max_steps=0")
    assert done.returncode == 2, done.stderr
    assert not (tmp_path / "new").exists()


@pytest.mark.slow
def test_study_an_existing_folder_whose_name_holds_an_equals_sign_is_the_folder(tmp_path):
    """It was read as an override (a=b), and the study went to multirun/."""
    folder = tmp_path / "a=b"
    folder.mkdir()
    done = study("--schemes", "rope", "--seeds", "1", "--list", str(folder))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(folder / "rope-s1")]


@pytest.mark.slow
def test_study_an_override_whose_value_holds_a_slash_is_no_folder(tmp_path):
    """With no folder given, `data.files=[/x/y.txt]` is an override (its key has no slash), not the study's folder."""
    done = study("--schemes", "rope", "--seeds", "1", "--list", f"data.files=[{tmp_path}/no.txt]")
    assert not (REPO / "data.files=[").exists() and all("data.files" not in line for line in done.stdout.split())
