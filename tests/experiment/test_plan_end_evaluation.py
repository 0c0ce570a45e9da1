"""The evaluation at the end of training is planned with the run: ``train.py --check`` refuses exactly what the run
would, and a run whose evaluation would be refused is refused before its first step, writing nothing.

The members are generated: every variation a study evaluates each scheme with (scripts/study_variations.json), at
a training length (16) that some of them do not fit (a window of 32), each run as a training with
``train.eval_after=true`` and checked as ``train.py --check``.
"""

from __future__ import annotations

import json

import pytest
from cli_runs import REPO

VARIATIONS = json.loads((REPO / "scripts" / "study_variations.json").read_text())
# Each variation once, with the first scheme (by name) that a study evaluates with it.
CASES = sorted(
    {
        variation: (scheme, variation) for scheme, vs in sorted(VARIATIONS.items(), reverse=True) for variation in vs
    }.values()
)
LAYERS = {"hybrid": 4, "rnope": 4, "llama4_inope": 4, "swan": 4}  # the per-layer presets need 4 layers


@pytest.mark.slow
@pytest.mark.parametrize("scheme, variation", CASES)
def test_check_refuses_exactly_what_the_end_of_training_evaluation_would(cli, tmp_path, scheme, variation):
    run = tmp_path / "run"
    settings = [
        f"pe={scheme}", f"model.n_layer={LAYERS.get(scheme, 1)}", "train.max_steps=2", "train.eval_after=true",
        "eval.lengths=[16,32]", "eval.protocols=[nonoverlapping]", f"eval.variations=[none,{variation}]",
    ]  # fmt: skip
    checked = cli.here("train.py", "--check", *cli.overrides(run, *settings))
    trained = cli.train_here(run, *settings)
    assert checked.returncode == trained.returncode, (checked.stderr, trained.stderr)
    if trained.returncode != 0:
        assert trained.returncode == 2 and checked.stderr == trained.stderr, (checked.stderr, trained.stderr)
        assert not run.exists(), "a run refused for its evaluation wrote its directory"
    else:
        document = json.loads((run / "eval" / "extrapolation.json").read_text())
        assert len({row.get("variation") for row in document["results"]}) == 2, "the variation was not scored"


@pytest.mark.slow
def test_resuming_a_finished_run_with_other_lengths_evaluates_them(cli, tmp_path):
    """``train.resume=true eval.lengths=[...]`` on a finished run scores the lengths it lacks; given once more, it has
    them and there is nothing to do."""
    run = tmp_path / "run"
    given = ["pe=rope", "train.max_steps=2", "train.eval_after=true", "eval.max_tokens=256"]
    first = cli.train_here(run, *given, "eval.lengths=[16]")
    assert first.returncode == 0, first.stderr
    again = cli.train_here(run, *given, "eval.lengths=[16]", "train.resume=true")
    assert "nothing to do" in again.stdout, again.stderr
    longer = cli.train_here(run, *given, "eval.lengths=[16,32]", "train.resume=true")
    assert longer.returncode == 0, longer.stderr
    rows = json.loads((run / "eval" / "extrapolation.json").read_text())["results"]
    assert {row["length"] for row in rows} == {16, 32}
    once_more = cli.train_here(run, *given, "eval.lengths=[16,32]", "train.resume=true")
    assert "nothing to do" in once_more.stdout, once_more.stderr
