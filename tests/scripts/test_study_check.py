"""scripts/study_check.py, as scripts/study.sh calls it: a line per scheme, a scheme's first seed refused is a
verdict, a later seed refused stops it in one line (tests/scripts/test_compare.py runs it over every scheme)."""

import os
import subprocess
import sys

import pytest
from cli_runs import assert_one_line_error, load_script
from repo_root import REPO

SMALL = ["model=tiny", "train.seq_len=16", "train.batch_size=2", "train.max_steps=1"]


def study_check(*args: str, cache) -> subprocess.CompletedProcess:
    command = [sys.executable, str(REPO / "scripts" / "study_check.py"), *args]
    env = {**os.environ, "POSGPT_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)


@pytest.mark.slow
def test_a_line_per_scheme_and_a_refused_scheme_is_a_verdict(tmp_path):
    done = study_check("1", "rope", "rnope", "--", *SMALL, "logging.progress=false", cache=tmp_path)
    assert done.returncode == 0, done.stderr
    rope, rnope = done.stdout.splitlines()
    assert rope == "rope accepted" and rnope.startswith("rnope refused ") and "model.n_layer >= 4" in rnope


@pytest.mark.slow
def test_a_later_seed_refused_stops_it_in_one_line(tmp_path):
    done = study_check("1,99999999999999999999", "rope", "--", *SMALL, "logging.progress=false", cache=tmp_path)
    assert_one_line_error(done, "job 1 of the sweep (train.seed=99999999999999999999)", "is out of its domain")
    assert done.stdout == ""


def test_a_call_without_its_separator_is_its_usage_line(capsys):
    with pytest.raises(SystemExit) as stopped:
        load_script("study_check").main(["1", "rope"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().startswith("error: usage: study_check.py")
