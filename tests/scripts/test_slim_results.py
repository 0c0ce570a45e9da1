"""scripts/slim_results.py keeps what scripts/compare.py reads and removes only what a command rebuilds; and
results/ holds no code, no per-run CSV, no per-position losses, no figure that no page shows, and at most 15 MB."""

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import slim_results
from doc_pages import PAGES, links
from repo_root import REPO

from core.rundir import RUN_MARKERS, lock_run
from evaluation.perplexity_format import PERPLEXITY_ROWS
from evaluation.render import write_csv
from evaluation.store import document_text, write_document
from evaluation.task_accuracy import TASK_ROWS

RESULTS = REPO / "results"
ROW = {"length": 4, "protocol": "nonoverlapping", "stride": None, "variation": "", "data": "d", "tokens": 8}
STEP = {"step": 10, "train_loss": 3.5, "lr": 0.001, "grad_norm": 0.5, "tokens_per_s": 900.0, "mfu": None}
START = {"step": 0, "attn_backend": "sdpa", "dtype": "float32"}


def extrapolation(rows: int = 2) -> dict:
    bins = [{"positions": [1, 3], "loss": 2.0, "tokens": 4}, {"positions": [3, 5], "loss": 1.0, "tokens": 4}]
    return {
        "pe": "rope",
        "train_seq_len": 4,
        "step": 10,
        "results": [
            {
                **ROW,
                "length": 4 * (i + 1),
                "loss": 1.5,
                "ppl": 4.48,
                "per_position_loss": [2.0, 2.0, 1.0, 1.0],
                "per_position_bins": bins,
            }
            for i in range(rows)
        ],
    }


def task_document() -> dict:
    row = {"task": "passkey", "length": 4, "depth": None, "variation": "", "accuracy": 1.0, "n": 10, "correct": 10}
    return {"task": "passkey", "pe": "rope", "train_seq_len": 4, "step": 10, "results": [row]}


@pytest.fixture
def study(tmp_path: Path) -> Path:
    """A study as export_results.py writes it: a language-model run and a task run."""
    lm, task = tmp_path / "study" / "rope-s1", tmp_path / "study" / "passkey-rope-s1"
    write_document(extrapolation(), lm / "eval", PERPLEXITY_ROWS)
    write_csv(extrapolation(), lm / "eval" / "extrapolation.csv", PERPLEXITY_ROWS)
    (lm / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in [START, STEP, {**STEP, "step": 20, "val_loss": 3.0}])
    )
    write_document(task_document(), task / "eval", TASK_ROWS)
    write_csv(task_document(), task / "eval" / "tasks.csv", TASK_ROWS)
    return tmp_path / "study"


def test_slimming_keeps_what_compare_reads_and_removes_what_a_command_rebuilds(study, capsys):
    slim_results.main([str(study)])
    document = json.loads((study / "rope-s1" / "eval" / "extrapolation.json").read_text())
    expected = extrapolation()
    for row in expected["results"]:
        del row["per_position_loss"]
    del expected["results"][0]["per_position_bins"]  # --per-position draws only the longest length: 8
    assert document == expected
    assert not (study / "rope-s1" / "eval" / "extrapolation.csv").exists()
    assert not (study / "passkey-rope-s1" / "eval" / "tasks.csv").exists()
    assert (study / "passkey-rope-s1" / "eval" / "tasks.json").read_text() == document_text(task_document())
    metrics = [json.loads(line) for line in (study / "rope-s1" / "metrics.jsonl").read_text().splitlines()]
    assert metrics == [START, {"step": 10, "train_loss": 3.5}, {"step": 20, "train_loss": 3.5, "val_loss": 3.0}]
    assert "2 files slimmed, 2 removed" in capsys.readouterr().out


def test_bins_are_kept_where_per_position_can_draw_them():
    """At each selection's longest scored length (protocol, data, measure), and on every sliding row."""
    rows = [
        {"length": 8, "protocol": "nonoverlapping", "data": "d", "ppl": 2.0},
        {"length": 16, "protocol": "nonoverlapping", "data": "d", "ppl": 3.0},
        {"length": 32, "protocol": "nonoverlapping", "data": "d", "ppl": None, "loss": None},  # n/a: not scored
        {"length": 16, "protocol": "nonoverlapping", "data": "d", "ppl": 3.0, "variation": "yarn:2"},
        {"length": 8, "protocol": "nonoverlapping", "data": "other", "ppl": 2.0},
        {"length": 16, "protocol": "nonoverlapping", "data": "d", "ppl": 3.0, "measure": "key_tokens"},
        {"length": 8, "protocol": "sliding", "data": "d", "ppl": 2.0},
        {"length": 16, "protocol": "sliding", "data": "d", "ppl": 2.0},
        {"length": 16, "protocol": "streaming", "data": "d", "ppl": None, "loss": 800.0},  # inf: scored, diverged
        {"length": 8, "protocol": "streaming", "data": "d", "ppl": 2.0},
    ]
    assert slim_results.bins_drawn(rows) == [False, True, False, True, True, True, True, True, True, False]


def test_metrics_keep_validation_steps_the_ends_and_every_hundredth_training_step():
    steps = [{"step": step, "train_loss": 1.0, "lr": 0.1} for step in range(10, 260, 10)]
    steps[9]["val_loss"] = 2.0  # step 100
    steps[14]["val_loss"] = 2.0  # step 150
    text = "".join(json.dumps(record) + "\n" for record in [START, *steps, {"step": 250, "init_from": "p"}])
    kept = [json.loads(line) for line in slim_results.slim_metrics(text).splitlines()]
    assert [record["step"] for record in kept] == [0, 10, 100, 150, 200, 250, 250]
    assert kept[0] == START and kept[-1] == {"step": 250, "init_from": "p"}  # other records whole
    assert kept[3] == {"step": 150, "train_loss": 1.0, "val_loss": 2.0}
    assert slim_results.slim_metrics(slim_results.slim_metrics(text)) == slim_results.slim_metrics(text)


def test_slimming_again_changes_nothing(study, capsys):
    slim_results.main([str(study)])
    files = {path: path.read_bytes() for path in study.rglob("*") if path.is_file()}
    slim_results.main([str(study)])
    assert {path: path.read_bytes() for path in study.rglob("*") if path.is_file()} == files
    assert "0 files slimmed, 0 removed" in capsys.readouterr().out


@pytest.mark.parametrize("run, name", [("rope-s1", "extrapolation.json"), ("passkey-rope-s1", "tasks.json")])
def test_every_results_json_is_written_compact_and_holds_the_same_document(study, run, name):
    """Every evaluator's results file is rewritten as evaluation/store.py writes it today (compact JSON, a row a
    line), whatever spacing it was written with: the same document (slimmed), fewer bytes."""
    path = study / run / "eval" / name
    path.write_text(json.dumps(json.loads(path.read_text()), indent=2))
    spaced = json.loads(path.read_text())
    slim_results.main([str(study)])
    text = path.read_text()
    assert text == document_text(json.loads(text)) and ": " not in text and len(text.splitlines()) > 2
    expected = slim_results.slim_document(spaced) if name == "extrapolation.json" else spaced
    assert json.loads(text) == expected


def test_csv_writes_the_removed_csvs_back_as_they_were(study):
    written = {path: path.read_bytes() for path in study.rglob("*.csv")}
    slim_results.main([str(study)])
    slim_results.main(["--csv", str(study)])
    assert {path: path.read_bytes() for path in study.rglob("*.csv")} == written


def test_an_older_csvs_column_is_accepted_where_the_json_records_it(study):
    """A CSV of an older posgpt has a column today's writer no longer writes (scaling): the row records it."""
    path = study / "rope-s1" / "eval" / "extrapolation.json"
    document = json.loads(path.read_text())
    for row in document["results"]:
        row["scaling"] = {"type": "none"}
    write_document(document, path.parent, PERPLEXITY_ROWS)
    csv_path = path.with_name("extrapolation.csv")
    lines = csv_path.read_text().splitlines()
    csv_path.write_text("".join(f"{line},{'scaling' if i == 0 else 'none'}\n" for i, line in enumerate(lines)))
    slim_results.main([str(study)])
    assert not csv_path.exists()


@pytest.mark.parametrize(
    "edit, problem",
    [
        (lambda text: text.replace("4.48", "4.49", 1), "line 2: ppl is '4.49', the JSON's is '4.48'"),
        (lambda text: text + text.splitlines()[1] + "\n", "3 rows, the JSON has 2"),
        (lambda text: "".join(f"{line},x\n" for line in text.splitlines()), "column 'x' is not in the JSON"),
    ],
    ids=["a value", "a row", "a column"],
)
def test_a_csv_holding_more_than_its_json_is_refused_before_anything_is_written(study, capsys, edit, problem):
    csv_path = study / "rope-s1" / "eval" / "extrapolation.csv"
    csv_path.write_text(edit(csv_path.read_text()))
    files = {path: path.read_bytes() for path in study.rglob("*") if path.is_file()}
    with pytest.raises(SystemExit) as exit_info:
        slim_results.main([str(study)])
    assert exit_info.value.code == 2 and problem in capsys.readouterr().err
    assert {path: path.read_bytes() for path in study.rglob("*") if path.is_file()} == files


def tree_digest(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (and ``root`` itself): a file's SHA-256, a folder as "folder"."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "folder"
        for path in (root, *sorted(root.rglob("*")))
    }


def refused_as_a_run(capsys, args: list[str], given: Path, run: Path) -> None:
    """slim_results.py ``args`` ``given`` refuses ``run``, a training run's directory, in one line naming it and the
    export that slims it, exit 2, and leaves the tree under ``given`` byte for byte as it was."""
    before = tree_digest(given)
    with pytest.raises(SystemExit) as exit_info:
        slim_results.main([*args, str(given)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"error: {run} is a training run's directory" in err, err
    assert f"python scripts/export_results.py {run} --to DIR --slim" in err and "nothing was written" in err, err
    assert tree_digest(given) == before


@pytest.mark.parametrize("args", [[], ["--csv"]], ids=["slim", "csv"])
def test_a_run_still_training_is_refused_and_left_as_it_is(study, capsys, args):
    """A training run's directory (its checkpoints/ marks it), whose lock another command holds or not: slimming it
    in place would rewrite its own log and results (and files a command holding it is writing). Refused, naming it
    and the export that slims it; nothing written, before the lock is let go of and after."""
    run = study / "rope-s1"
    (run / "checkpoints").mkdir()
    with lock_run(run):  # as train.py holds it while it trains
        refused_as_a_run(capsys, args, study, run)
    refused_as_a_run(capsys, args, study, run)  # once it has ended: still a run, still refused


@pytest.mark.parametrize("args", [[], ["--csv"]], ids=["slim", "csv"])
@pytest.mark.parametrize("where", ["given", "top", "nested"])
@pytest.mark.parametrize("kind", ["folder", "file"])
@pytest.mark.parametrize("marker", RUN_MARKERS)
def test_a_folder_holding_a_training_run_is_refused_for_every_run_marker(study, capsys, args, where, kind, marker):
    """Every entry that makes a directory a training run's (core.rundir.RUN_MARKERS), as a folder or a file, in the
    folder given itself, in a run directly below it, or in one deeper down: refused, naming that run, and the tree
    left as it was; without the marker the same study is slimmed."""
    run = {"given": study, "top": study / "rope-s1", "nested": study / "group" / "sub" / "rope-s1"}[where]
    if where == "nested":
        shutil.copytree(study / "rope-s1", run)
    (run / marker).mkdir() if kind == "folder" else (run / marker).write_text("")
    refused_as_a_run(capsys, args, study, run)
    shutil.rmtree(run / marker) if kind == "folder" else (run / marker).unlink()
    slim_results.main([*args, str(study)])


def test_results_are_as_slimming_leaves_them():
    """Nothing under results/ that python scripts/slim_results.py results/*/ would change or remove."""
    assert {str(path.relative_to(RESULTS)): change for path, change in slim_results.plan_folder(RESULTS).items()} == {}


# The bound on what a clone carries for the results: 15 MB, in SI units (15 * 10**6 bytes, not MiB)
RESULTS_BYTES = 15 * 10**6


def results_files() -> list[Path]:
    """The files under results/ that git tracks; every file there where this is no git checkout (a superset)."""
    if shutil.which("git") is not None:
        listed = subprocess.run(["git", "ls-files", "-z", "--", "results"], cwd=RESULTS.parent, capture_output=True)
        if listed.returncode == 0:
            return [RESULTS.parent / name for name in listed.stdout.decode().split("\0") if name]
    return sorted(path for path in RESULTS.rglob("*") if path.is_file())


def test_results_hold_at_most_15_mb():
    """The sum of the tracked files' sizes (their contents, not the blocks they take on disk); slim_results.py
    and export_results.py --slim keep a study's results to what compare.py reads."""
    files = [path for path in results_files() if path.is_file()]  # a tracked file deleted in the work tree: gone
    assert files
    total = sum(path.stat().st_size for path in files)
    largest = sorted(files, key=lambda path: path.stat().st_size)[-3:]
    assert total <= RESULTS_BYTES, f"results/ holds {total:,} bytes (at most {RESULTS_BYTES:,}); largest: {largest}"


def test_results_hold_no_code_no_run_csv_and_no_per_position_losses():
    assert sorted(RESULTS.rglob("*.py")) == []
    assert sorted(RESULTS.rglob("eval/*.csv")) == []
    assert [p for p in RESULTS.rglob("eval/extrapolation.json") if "per_position_loss" in p.read_text()] == []
    assert [
        p for p in RESULTS.rglob("*metrics.jsonl") if re.search(r'"(lr|grad_norm|tokens_per_s|mfu)"', p.read_text())
    ] == []


def test_every_figure_under_results_is_shown_by_a_page():
    """A figure compare.py redraws is committed only where a page shows it (each study's README gives the command)."""
    shown = {
        (page.parent / target.partition("#")[0]).resolve()
        for page in PAGES
        for target in links(page)
        if not re.match(r"[a-z]+:", target)
    }
    assert sorted(str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*.png") if p.resolve() not in shown) == []
