"""A results file cut short (a document truncated, a metrics log whose last line a kill tore) is refused by every
command that reads results, through its command line: one line naming the file, exit code 2, nothing written, never
read or exported as if whole. The runs are copies of committed results (results/): a perplexity run and a task run.
"""

import hashlib
import shutil
from pathlib import Path

import pytest
from repo_root import REPO

from core.errors import PosGPTError
from core.files import read_json, read_jsonl

RESULTS = REPO / "results"
PERPLEXITY_RUN = RESULTS / "study-width256" / "rope-s1"
TASK_RUN = RESULTS / "task-study-uniform" / "copy-alibi-s1"


def runs(tmp_path: Path) -> tuple[Path, Path]:
    copies = tmp_path / "runs"
    for run in (PERPLEXITY_RUN, TASK_RUN):
        shutil.copytree(run, copies / run.name)
    return copies / PERPLEXITY_RUN.name, copies / TASK_RUN.name


def cut(path: Path, lost: int) -> None:
    """``path`` cut short by ``lost`` bytes, as a kill mid-write leaves a file written in place."""
    path.write_bytes(path.read_bytes()[:-lost])


def tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def damage(run: Path, kind: str) -> Path:
    """Damage one results file of ``run`` the way ``kind`` says; returns it."""
    path = run / "metrics.jsonl" if kind == "torn metrics" else next((run / "eval").glob("*.json"))
    cut(path, path.stat().st_size // 2 if kind == "truncated document" else 20)  # a line is longer than 20 bytes
    return path


def commands(perplexity: Path, task: Path, out: Path) -> dict[str, list[str]]:
    return {
        "compare": ["scripts/compare.py", str(perplexity), str(task), "--markdown", str(out / "c.md")],
        "compare --val-curve": [
            "scripts/compare.py",
            str(perplexity),
            "--markdown",
            str(out / "v.md"),
            "--val-curve",
            str(out / "val.png"),
        ],
        "export": ["scripts/export_results.py", str(perplexity), str(task), "--to", str(out / "export")],
        "slim": ["scripts/slim_results.py", str(perplexity.parent)],
    }


KINDS = ["truncated document", "torn metrics"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("damaged", ["perplexity", "task"])
@pytest.mark.parametrize("command", ["compare", "compare --val-curve", "export", "slim"])
def test_every_results_reader_refuses_a_damaged_file(cli, tmp_path, command, damaged, kind):
    perplexity, task = runs(tmp_path)
    if command == "compare --val-curve" and damaged == "task":
        pytest.skip("the task run is not part of this comparison")
    path = damage(perplexity if damaged == "perplexity" else task, kind)
    if kind == "torn metrics" and command == "compare":
        pytest.skip("compare without --val-curve reads no metrics")
    out = tmp_path / "out"
    out.mkdir()
    before = tree_digest(tmp_path / "runs")
    done = cli.here(*commands(perplexity, task, out)[command])
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr
    assert str(path) in done.stderr and ("damaged" in done.stderr)
    assert list(out.iterdir()) == [] and tree_digest(tmp_path / "runs") == before


@pytest.mark.slow
def test_whole_results_still_compare_export_and_slim(cli, tmp_path):
    """The same commands on the undamaged copies succeed: the refusals above are the damage's."""
    perplexity, task = runs(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    for command in commands(perplexity, task, out).values():
        done = cli.here(*command)
        assert done.returncode == 0, done.stderr


def test_a_torn_last_line_is_refused_or_dropped_as_asked(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1}\n{"step": 2}\n{"ste')
    with pytest.raises(PosGPTError, match="its last line is cut short"):
        read_jsonl(log)
    assert read_jsonl(log, drop_torn_tail=True) == [{"step": 1}, {"step": 2}]
    log.write_text('{"step": 1}\n{"st\n{"step": 3}\n')  # damage inside the file is never dropped
    for drop in (False, True):
        with pytest.raises(PosGPTError, match="line 2 is not JSON"):
            read_jsonl(log, drop_torn_tail=drop)
    assert read_jsonl(tmp_path / "absent.jsonl") is None and read_json(tmp_path / "absent.json") is None
    (tmp_path / "cut.json").write_text('{"results": [{"length": 6')
    with pytest.raises(PosGPTError, match="cut.json is damaged or not JSON"):
        read_json(tmp_path / "cut.json")


@pytest.mark.slow
def test_compare_refuses_a_missing_attention_file_before_writing_anything(cli, tmp_path):
    """--entropy reads each run's eval/attention.json: a run without one is refused before the markdown and the
    plots of the options before it are written."""
    perplexity, _ = runs(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    done = cli.here(
        "scripts/compare.py", str(perplexity), "--markdown", str(out / "c.md"), "--entropy", str(out / "e.png")
    )
    assert done.returncode == 2 and "attention.json does not exist" in done.stderr, done.stderr
    assert list(out.iterdir()) == []
