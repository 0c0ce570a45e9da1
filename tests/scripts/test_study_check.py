"""scripts/study_check.py, as scripts/study.sh calls it: the study's plan, every run of it, in one file; a scheme's
first seed refused is skipped with one line, a later seed refused stops it in one line (tests/scripts/test_compare.py
runs it over every scheme; tests/commands/test_script_options_property.py generates its options)."""

from pathlib import Path

import pytest
from cli_runs import assert_one_line_error

SMALL = ["model=tiny", "train.seq_len=64", "train.batch_size=2", "train.max_steps=1", "logging.progress=false"]


def plan_of(path: Path) -> list[str]:
    return path.read_bytes().decode().split("\0")


@pytest.mark.slow
def test_the_plan_holds_every_run_and_a_refused_scheme_is_skipped_in_one_line(cli, tmp_path):
    plan, study = tmp_path / "plan", str(tmp_path / "s")
    done = cli.here(
        "scripts/study_check.py", "--plan-to", str(plan), "--seeds", "2", "--schemes", "rope,rnope", study, *SMALL
    )
    assert done.returncode == 0, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("study: pe=rnope is refused with these settings") and "model.n_layer >= 4" in line
    fields = plan_of(plan)
    assert fields[:3] == [study, "text", "train"]
    runs, i = [], 3
    while i < len(fields):
        run, task, scheme, variations, count = fields[i : i + 5]
        runs.append((run, task, scheme, fields[i + 5 : i + 5 + int(count)]))
        i += 5 + int(count)
    assert [run[:3] for run in runs] == [(f"{study}/rope-s1", "none", "rope"), (f"{study}/rope-s2", "none", "rope")]
    assert runs[0][3][-2:] == ["pe=rope", "train.seed=1"] and "model=tiny" in runs[0][3]
    assert Path(study).is_dir()  # made once every run is planned


@pytest.mark.slow
def test_a_later_seed_refused_stops_it_in_one_line_and_makes_nothing(cli, tmp_path):
    done = cli.here(
        "scripts/study_check.py",
        "--plan-to",
        str(tmp_path / "plan"),
        "--seed-list",
        "1,99999999999999999999",
        "--schemes",
        "rope",
        str(tmp_path / "study"),
        *SMALL,
    )
    assert_one_line_error(done, "job 1 of the sweep (train.seed=99999999999999999999)", "is out of its domain")
    assert done.stdout == "" and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_evaluation_each_run_gets_after_training_is_checked_before_any_trains(cli, tmp_path, monkeypatch):
    """$EVAL_VARIATIONS, the variations eval.py scores each run with once it has trained: one it would refuse was
    found only after the first run had trained."""
    monkeypatch.setenv("EVAL_VARIATIONS", "[bogus:1]")
    plan, study = str(tmp_path / "plan"), str(tmp_path / "study")
    done = cli.here("scripts/study_check.py", "--plan-to", plan, "--schemes", "rope", study, *SMALL)
    assert_one_line_error(done, "pe=rope's evaluation with eval.variations=[bogus:1]", "type='bogus'")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_schemes_own_variations_are_checked_against_the_training_length(cli, tmp_path, monkeypatch):
    """RoPE's study variations hold windows of 32 tokens, which a run trained at 16 has never seen: eval.py refuses
    them once the run is trained, so the study refuses them before (and --list does not list such a run)."""
    monkeypatch.delenv("EVAL_VARIATIONS", raising=False)
    plan, study = str(tmp_path / "plan"), str(tmp_path / "study")
    argv = ["--plan-to", plan, "--list", "--schemes", "rope", study, *SMALL, "train.seq_len=16"]
    done = cli.here("scripts/study_check.py", *argv)
    assert_one_line_error(done, "pe=rope's evaluation with eval.variations=[", "window=32 must be shorter", "16")
    assert list(tmp_path.iterdir()) == []
