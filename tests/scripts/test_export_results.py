"""scripts/export_results.py replaces an export only with the same run's: a folder that holds another run's export
(a run of the same directory name trained otherwise) is refused in one line naming both, exit 2, and nothing is
written; the same run exported again, grown, replaces its export. Through the command line, in this process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_runs import assert_one_line_error, evaluated_run


def snapshot(directory: Path) -> dict:
    return {path.relative_to(directory): path.read_bytes() for path in directory.rglob("*") if path.is_file()}


def export(cli, *args):
    return cli.here("scripts/export_results.py", *map(str, args))


@pytest.fixture(scope="module")
def evaluated(cli, tmp_path_factory) -> Path:
    """A run with results (a checkpoint of untrained weights, evaluated at one length)."""
    return evaluated_run(cli, tmp_path_factory.mktemp("first"))


def edited_copy(run_dir: Path, destination: Path, edit) -> Path:
    """A copy of ``run_dir`` whose results record a trained config changed by ``edit`` (a function of it)."""
    shutil.copytree(run_dir, destination)
    path = destination / "eval" / "extrapolation.json"
    document = json.loads(path.read_text())
    edit(document["config"])
    path.write_text(json.dumps(document))
    return destination


def test_an_export_of_another_run_of_the_same_name_is_refused_and_writes_nothing(cli, evaluated, tmp_path):
    assert export(cli, evaluated, "--to", tmp_path / "exported").returncode == 0
    before = snapshot(tmp_path / "exported")
    other = edited_copy(evaluated, tmp_path / "other" / "run", lambda config: config["train"].update(seed=7))
    done = export(cli, other, "--to", tmp_path / "exported")
    assert_one_line_error(
        done, f"--to {tmp_path}/exported/run holds the export of another run than {other}", "train.seed=7 in"
    )
    assert "nothing was written" in done.stderr
    assert snapshot(tmp_path / "exported") == before


def test_the_same_run_exported_again_replaces_its_export(cli, evaluated, tmp_path):
    """A resumed run trains longer (train.max_steps is what a resume may change): still the same run."""
    assert export(cli, evaluated, "--to", tmp_path / "exported").returncode == 0
    grown = edited_copy(evaluated, tmp_path / "grown" / "run", lambda config: config["train"].update(max_steps=99))
    done = export(cli, grown, "--to", tmp_path / "exported")
    assert done.returncode == 0, done.stderr
    exported = json.loads((tmp_path / "exported" / "run" / "eval" / "extrapolation.json").read_text())
    assert exported["config"]["train"]["max_steps"] == 99


def test_a_folder_of_exported_files_that_say_no_run_is_not_overwritten(cli, evaluated, tmp_path):
    (tmp_path / "exported" / "run").mkdir(parents=True)
    (tmp_path / "exported" / "run" / "metrics.jsonl").write_text('{"step": 0}\n')
    done = export(cli, evaluated, "--to", tmp_path / "exported")
    assert_one_line_error(done, f"--to {tmp_path}/exported/run holds exported files but no results saying which run")
    assert snapshot(tmp_path / "exported") == {Path("run/metrics.jsonl"): b'{"step": 0}\n'}


def test_a_slim_export_is_what_slim_results_leaves(cli, evaluated, tmp_path):
    """--slim: the export a study commits under results/, in one step; the same as exporting, then slimming."""
    assert export(cli, evaluated, "--to", tmp_path / "plain").returncode == 0
    assert cli.here("scripts/slim_results.py", str(tmp_path / "plain")).returncode == 0
    done = export(cli, evaluated, "--to", tmp_path / "slim", "--slim")
    assert done.returncode == 0, done.stderr
    assert "slim_results:" in done.stdout
    assert snapshot(tmp_path / "slim") == snapshot(tmp_path / "plain")
    assert not (tmp_path / "slim" / "run" / "eval" / "extrapolation.csv").exists()


def test_a_slim_export_into_a_folder_holding_a_training_run_is_refused_and_writes_nothing(cli, evaluated, tmp_path):
    """slim_results.py refuses a training run's directory: a run below the export's folder (a run copied there,
    checkpoints and all) is refused before the export writes, not after it, half done."""
    assert export(cli, evaluated, "--to", tmp_path / "exported").returncode == 0
    nested = Path(shutil.copytree(evaluated, tmp_path / "exported" / "run" / "old" / "run"))
    before = snapshot(tmp_path / "exported")
    done = export(cli, evaluated, "--to", tmp_path / "exported", "--slim")
    assert_one_line_error(done, f"{nested} is a training run's directory", "move it out of --to", "nothing was written")
    assert snapshot(tmp_path / "exported") == before
    assert export(cli, evaluated, "--to", tmp_path / "exported").returncode == 0  # not slimmed: the run is kept


@pytest.mark.parametrize("into", ["", "exports"], ids=["itself", "a folder inside it"])
def test_a_run_exported_into_itself_is_refused_and_writes_nothing(cli, evaluated, into):
    """cp refuses to copy a folder into itself; so does the export (core.files.check_outputs: no output lies in a
    training run the command reads)."""
    before = snapshot(evaluated)
    done = export(cli, evaluated, "--to", evaluated / into)
    assert_one_line_error(done, f"lies in the training run {evaluated.resolve()}", "nothing was written")
    assert snapshot(evaluated) == before and not (evaluated / into / evaluated.name).exists()
