"""A run directory from elsewhere is data: a stored config is never resolved, and no write follows a link out.

The members of each class are generated, not listed: every key of a stored config takes an interpolation in turn,
and every file a command writes (found by running it and comparing the tree before and after), every folder on
the way to it and the lock file are replaced in turn by a link to a file or folder outside. Each command runs
through its real command line (in this process, Runner.here) and must answer one ``error:`` line, exit 2, and leave
the tree, the link's target outside included, byte for byte as it was.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from cli_runs import STEPS, TIMEOUT_S, assert_one_line_error, evaluated_run
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image
from refusals import INSPECT, tree
from tiny_checkpoint import make_run

from core.checkpoint_io import last_checkpoint_path, load_checkpoint
from core.errors import PosGPTError
from core.files import TMP_PREFIX, atomic_write, inside, make_folder, open_append, remove
from core.rundir import LOCK_FILE, lock_run
from core.stored import check_literal
from core.text import markdown_text, printable
from evaluation.perplexity_format import PERPLEXITY_ROWS
from evaluation.store import load_document
from evaluation.task_accuracy import TASK_ROWS
from experiment.settings import trained_config

INTERPOLATION = "${oc.env:HOME}"


def leaf_keys(config: dict, prefix: tuple = ()) -> Iterator[tuple]:
    """The path of every leaf of a nested dict (lists are leaves: a value as a whole)."""
    for key, value in config.items():
        if isinstance(value, dict) and value:
            yield from leaf_keys(value, (*prefix, key))
        else:
            yield (*prefix, key)


def planted(config: dict, key: tuple, value: object = INTERPOLATION) -> dict:
    copy = json.loads(json.dumps(config))
    node = copy
    for part in key[:-1]:
        node = node[part]
    node[key[-1]] = value
    return copy


@pytest.fixture(scope="module")
def evaluated(cli, tmp_path_factory) -> Path:
    return evaluated_run(cli, tmp_path_factory.mktemp("evaluated"))


@pytest.fixture
def run(evaluated, tmp_path) -> Path:
    return Path(shutil.copytree(evaluated, tmp_path / "run"))


def test_every_stored_key_holding_an_interpolation_is_refused_naming_the_file(run, monkeypatch):
    monkeypatch.setenv("POSGPT_PLANTED", "resolved")
    checkpoint = load_checkpoint(run)
    keys = list(leaf_keys(checkpoint["config"]))
    assert len(keys) > 50  # every setting of the schema
    for key in keys:
        config = planted(checkpoint["config"], key, "${oc.env:POSGPT_PLANTED}")
        with pytest.raises(PosGPTError, match=r"source\.pt: its stored config holds .*read literally"):
            check_literal(config, "source.pt")
        with pytest.raises(PosGPTError, match="read literally"):
            trained_config(config)
    # a key's name too, and an interpolation inside a list or a longer string
    for config in ({"data": {"${x}": 1}}, {"eval": {"lengths": [16, "${x}"]}}, {"data": {"name": "a-${x}-b"}}):
        with pytest.raises(PosGPTError, match="read literally"):
            check_literal(config, "f")


def test_a_checkpoint_and_a_results_file_are_refused_where_they_are_read(run):
    checkpoint = load_checkpoint(run)
    checkpoint["config"] = planted(checkpoint["config"], ("data", "name"))
    torch.save(checkpoint, last_checkpoint_path(run))
    with pytest.raises(PosGPTError, match=f"{last_checkpoint_path(run)}: its stored config holds data.name"):
        load_checkpoint(run)
    results = run / "eval" / "extrapolation.json"
    document = json.loads(results.read_text())
    document["config"] = planted(document["config"], ("pe", "name"))
    results.write_text(json.dumps(document))
    with pytest.raises(PosGPTError, match=f"{results}: its stored config holds pe.name"):
        load_document(run / "eval", PERPLEXITY_ROWS)
    assert load_document(run / "eval", TASK_ROWS) is None  # no task results: nothing to refuse


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        lambda run, out: ("eval.py", f"run_dir={run}", "eval.lengths=[16]"),
        lambda run, out: ("sample.py", f"run_dir={run}", "sample.max_new_tokens=2"),
        lambda run, out: ("scripts/inspect_attention.py", f"run_dir={run}", *INSPECT),
        lambda run, out: ("scripts/compare.py", str(run), "--markdown", str(out / "c.md")),
        lambda run, out: ("scripts/export_results.py", str(run), "--to", str(out / "export")),
    ],
)
@pytest.mark.parametrize("stored", ["checkpoint", "results"])
def test_a_stored_interpolation_is_never_resolved_by_any_command(cli, run, tmp_path, command, stored, monkeypatch):
    """Each command that reads the planted file refuses it in one line, writing nothing; one that does not read it
    (an export copies a results file as it is) never shows the variable's value."""
    monkeypatch.setenv("POSGPT_PLANTED", "RESOLVED-VALUE")
    planted_value = "${oc.env:POSGPT_PLANTED}"
    if stored == "checkpoint":
        checkpoint = load_checkpoint(run)
        checkpoint["config"] = planted(checkpoint["config"], ("data", "name"), planted_value)
        torch.save(checkpoint, last_checkpoint_path(run))
    else:
        results = run / "eval" / "extrapolation.json"
        document = json.loads(results.read_text())
        document["config"] = planted(document["config"], ("data", "name"), planted_value)
        results.write_text(json.dumps(document))
    before = tree(tmp_path)
    done = cli.here(*command(run, tmp_path / "out"))
    after = tree(tmp_path)
    shown = done.stdout + done.stderr + "".join(str(value) for value in after.values())
    assert "RESOLVED-VALUE" not in shown
    script = Path(command(run, tmp_path)[0]).stem
    if script in READERS[stored] or done.returncode != 0:
        assert_one_line_error(done, "its stored config holds data.name", "read literally")
        assert after == before


# Which commands read each stored file (a results file is merged into by eval.py, read by compare and export).
READERS = {
    "checkpoint": {"eval", "sample", "inspect_attention", "compare"},
    "results": {"eval", "compare", "export_results"},
}


# No write leaves its folder: the writes are found by running the command, then each is planted with a link.


def writes_of(cli, source: Path, tmp_path: Path, argv: Callable[[Path, Path], tuple]) -> list[str]:
    """The entries (relative to ``source``) that ``argv`` creates, changes or removes on a copy of it, plus the lock
    file a command that writes a run holds while it runs; the folders on the way to each of them too."""
    trial = Path(shutil.copytree(source, tmp_path / "trial" / source.name))
    out = tmp_path / "trial" / "out"
    before = tree(trial)
    done = cli.here(*argv(trial, out))
    assert done.returncode == 0, done.stderr
    after = tree(trial)
    changed = {name for name in before.keys() | after.keys() if "folder" != after.get(name) != before.get(name)}
    paths = {*changed, LOCK_FILE} if argv(trial, out)[0] in WRITES_A_RUN else changed
    folders = {str(parent) for name in paths for parent in Path(name).parents if str(parent) != "."}
    shutil.rmtree(tmp_path / "trial")
    steps = sorted(name for name in paths if re.fullmatch(r"checkpoints/step_\d+\.pt", name))
    return sorted((paths | folders) - set(steps[1:]))  # one step checkpoint stands for the others (one write path)


WRITES_A_RUN = ("eval.py", "scripts/inspect_attention.py", "train.py")


def plant_link(root: Path, name: str, outside: Path) -> Path:
    """Replace ``root/name`` by a link to a copy of it (or a new file) under ``outside``; the copy is returned."""
    entry = root / name
    target = outside / name.replace("/", "_")
    outside.mkdir(parents=True, exist_ok=True)
    if entry.is_dir():
        shutil.copytree(entry, target)
        shutil.rmtree(entry)
    elif entry.exists():
        shutil.copyfile(entry, target)
        entry.unlink()
    else:
        entry.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("outside\n")
    entry.symlink_to(target)
    return target


@pytest.fixture(scope="module")
def exported(cli, evaluated, tmp_path_factory) -> Path:
    """An export of the evaluated run with a long metrics log: what slim_results.py rewrites and removes."""
    folder = tmp_path_factory.mktemp("exported")
    run = Path(shutil.copytree(evaluated, tmp_path_factory.mktemp("logged") / evaluated.name))
    (run / "metrics.jsonl").write_text("".join(f'{{"step": {s}, "train_loss": 2.5, "lr": 1}}\n' for s in range(99)))
    done = cli.here("scripts/export_results.py", str(run), "--to", str(folder))
    assert done.returncode == 0, done.stderr
    return folder


COMMANDS = {  # name: (the folder it writes: a run or an export, the command line)
    "eval": ("run", lambda run, out: ("eval.py", f"run_dir={run}", "eval.protocols=[sliding]", "eval.lengths=[16]")),
    "inspect": ("run", lambda run, out: ("scripts/inspect_attention.py", f"run_dir={run}", *INSPECT)),
    "slim": ("export", lambda folder, out: ("scripts/slim_results.py", str(folder))),
    "resume": ("trained", None),  # train.py's own command line: RESUME below
}
RESUME = ("train.resume=true", f"train.max_steps={STEPS + 2}", "train.checkpoint_every=1")


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_link_planted_on_any_write_path_is_refused_before_anything_is_written(
    cli, evaluated, exported, reference, tmp_path, command
):
    kind, argv = COMMANDS[command]
    source = {"run": evaluated, "export": exported, "trained": reference}[kind]
    if command == "resume":
        argv = lambda run, out: ("train.py", *cli.overrides(run, *RESUME))  # noqa: E731
    names = writes_of(cli, source, tmp_path, argv)
    assert names, "the command wrote nothing: nothing to plant"
    for index, name in enumerate(names):
        root = tmp_path / f"case{index}"
        folder = Path(shutil.copytree(source, root / source.name))
        plant_link(folder, name, root / "outside")
        before = tree(root)
        done = cli.here(*argv(folder, root / "out"))
        assert done.returncode != 0, f"{command} wrote through a link at {name}: {done.stderr}"
        assert_one_line_error(done, "link")
        assert tree(root) == before, f"{command} with a link at {name} changed the tree"


@pytest.mark.slow
def test_an_export_into_a_folder_with_planted_links_writes_nothing(cli, evaluated, tmp_path):
    export = lambda run, out: ("scripts/export_results.py", str(run), "--to", str(out))  # noqa: E731
    first = tmp_path / "first"
    assert cli.here(*export(evaluated, first)).returncode == 0
    exported = first / evaluated.name
    names = sorted(
        {str(p.relative_to(exported)) for p in exported.rglob("*")}
        | {str(parent) for p in exported.rglob("*") for parent in p.relative_to(exported).parents if str(parent) != "."}
    )
    for index, name in enumerate(names):
        root = tmp_path / f"case{index}"
        destination = Path(shutil.copytree(first, root / "to"))
        plant_link(destination / evaluated.name, name, root / "outside")
        before = tree(root)
        done = cli.here(*export(evaluated, destination))
        assert_one_line_error(done, "through a link")
        assert tree(root) == before, name


@pytest.mark.slow
def test_compare_with_a_link_planted_on_any_of_its_outputs_writes_nothing(cli, evaluated, tmp_path):
    """Its outputs (found by running it once) each replaced by a link to a file outside the folder named for them."""
    compare = lambda out: ("scripts/compare.py", str(evaluated), "--markdown", str(out / "c.md"))  # noqa: E731
    assert cli.here(*compare(tmp_path / "first")).returncode == 0
    names = sorted(path.name for path in (tmp_path / "first").iterdir())
    assert "c.md" in names and len(names) >= 2  # the markdown and its plot beside it
    for index, name in enumerate(names):
        root = tmp_path / f"case{index}"
        (root / "out").mkdir(parents=True)
        plant_link(root / "out", name, root / "outside")
        before = tree(root)
        assert_one_line_error(cli.here(*compare(root / "out")), "through a link")
        assert tree(root) == before, name


def test_every_write_primitive_refuses_a_link_out(tmp_path):
    folder, outside = tmp_path / "run", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    (outside / "target").write_text("kept")
    (folder / "link").symlink_to(outside / "target")
    (folder / "dir").symlink_to(outside)
    (folder / "inner").symlink_to(folder / "dir2")
    (folder / "dir2").mkdir()
    writes = {
        "atomic_write": lambda path: atomic_write(path, "x", folder),
        "open_append": lambda path: open_append(path, folder).close(),
        "remove": lambda path: remove(path, folder),
        "make_folder": lambda path: make_folder(path, folder),
    }
    for name, write in writes.items():
        for path in (folder / "dir" / "target", folder / "dir" / "new" / "file"):
            with pytest.raises(PosGPTError, match="through a link"):
                write(path)
        if name != "remove":  # removing a link removes the link itself, never what it points to
            with pytest.raises(PosGPTError, match="through a link"):
                write(folder / "link")
        write(folder / "inner" / "file")  # a link that stays inside is a path like any other
    assert (outside / "target").read_text() == "kept" and sorted(os.listdir(outside)) == ["target"]
    assert inside(folder, folder / "inner" / "x") == folder / "inner" / "x"


def test_a_planted_lock_link_is_refused_and_its_target_kept(tmp_path):
    run = make_run(tmp_path / "run", Path(__file__))
    target = tmp_path / "precious"
    target.write_text("kept")
    (run / LOCK_FILE).symlink_to(target)
    with pytest.raises(PosGPTError, match="through a link"), lock_run(run):
        pass
    assert target.read_text() == "kept"


# Names from paths are escaped wherever they are rendered.

# Every character a path's name can hold that a renderer reads as structure or markup, and the control characters.
NASTY = "|\n\r\t\x1b\u202e\\`*_[]<>#~$&'\"=,;{}%!"


@given(st.text())
def test_markdown_text_shows_any_text_literally_on_one_line(text):
    shown = markdown_text(text)
    assert not any(unicodedata.category(c)[0] == "C" for c in shown)
    unescaped = re.sub(r"\\(.)", "", shown)  # what is left once every escaped character is taken out
    assert not set(unescaped) & set("|\\`*<>#~$") and "](" not in unescaped
    assert re.sub(r"\\(.)", r"\1", shown) == printable(text)  # nothing lost: the escapes undo to the text


def table_cells(line: str) -> list[str]:
    return re.split(r"(?<!\\)\|", line.strip())[1:-1]


@pytest.mark.slow
def test_run_names_holding_markup_and_control_characters_render_literally(cli, tmp_path):
    """compare.py over runs labelled by their folders' names, each name a few of NASTY's characters: every table row
    keeps its header's cells, no line of the report holds a control character, each name is shown escaped, and the
    plot draws the names (a "$" is no mathematics)."""
    names = [f"n{NASTY[i : i + 6]}x" for i in range(0, len(NASTY), 6)]
    runs = []
    for index, name in enumerate(names):
        for seed in (1, 2):
            differing = [f"train.lr={1e-3 * (index + 1)}", f"train.warmup_steps={10 + index}"]
            differing += [f"train.max_steps={100 + index}", f"train.batch_size={4 + index}"]  # labelled by folders
            run = make_run(tmp_path / "runs" / name / f"run-s{seed}", cli.corpus, f"train.seed={seed}", *differing)
            assert cli.eval_here(run, "eval.lengths=[16]", "eval.protocols=[nonoverlapping]").returncode == 0
            runs.append(str(run))
    report, plot = tmp_path / "c.md", tmp_path / "c.png"
    done = cli.here("scripts/compare.py", *runs, "--markdown", str(report), "--plot", str(plot))
    assert done.returncode == 0, done.stderr
    text = report.read_text()
    assert not any(unicodedata.category(c)[0] == "C" for c in text.replace("\n", ""))
    tables = [line for line in text.splitlines() if line.startswith("|")]
    assert tables
    widths = {len(table_cells(line)) for line in tables if not line.startswith("|---")}
    assert len(widths) <= 2  # the perplexity table and the paired table, each whole
    for name in names:
        assert markdown_text(f"{printable(name)}/run") in text, name
    assert plot.stat().st_size > 0


def test_an_error_naming_a_path_with_a_newline_is_one_line(cli, tmp_path):
    folder = tmp_path / "a\nb"
    done = cli.here("eval.py", f"run_dir={folder}")
    assert_one_line_error(done, "a\\nb")


# An interruption at any moment: one line at most, exit 130 (Ctrl-C) or 143 (SIGTERM), every file whole or absent.

INTERRUPTED = {
    "eval": lambda run, out: ["eval.py", f"run_dir={run}", "eval.protocols=[sliding]", "eval.lengths=[16]"],
    "export": lambda run, out: ["scripts/export_results.py", str(run), "--to", str(out), "--slim"],
    "compare": lambda run, out: ["scripts/compare.py", str(run), "--markdown", str(out / "c.md")],
}  # export --slim: the export, then slim_results in place on what it wrote


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(INTERRUPTED))
def test_an_interrupted_command_leaves_every_file_as_it_was_or_whole(cli, evaluated, tmp_path, command):
    """Each command, run whole once, then interrupted while it imports (SIGINT) and while it works (SIGTERM): at
    most one line, the shell's exit code, and each file either as it was or whole."""
    argv = INTERRUPTED[command]

    def started(case: str) -> tuple[Path, subprocess.Popen]:
        root = tmp_path / case
        run = Path(shutil.copytree(evaluated, root / "run"))
        return root, cli.start_interruptible([sys.executable, *argv(run, root / "out")])

    start = time.monotonic()
    root, process = started("whole")
    assert process.wait(timeout=TIMEOUT_S) == 0, process.stderr.read()
    took = time.monotonic() - start
    whole, before = tree(root), tree(Path(shutil.copytree(evaluated, tmp_path / "before" / "run")).parent)
    # While it imports, and at two later points of its run (fractions of the whole run's time).
    for index, (at, signum) in enumerate([(0.1, signal.SIGINT), (0.8, signal.SIGTERM)]):
        root, process = started(f"case{index}")
        time.sleep(at * took)
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=TIMEOUT_S)
        if process.returncode != 0:  # else it had finished: nothing to check but the files
            # The shell's 128 + signal, as an exit code or as death by the signal (which the shell reports so):
            # SIGTERM before the command sets its handler, and SIGINT once Python is shutting down, end it so.
            assert process.returncode in (128 + signum, -signum), (at, took, stderr)
            assert len(stderr.strip().splitlines()) <= 1 and "Traceback" not in stderr, stderr
        for name, content in tree(root).items():
            assert not Path(name).name.startswith(TMP_PREFIX), f"{name}: a temporary file left behind"
            if content != before.get(name):
                assert is_whole(content, whole.get(name)), f"{name} is torn (interrupted at {at:.0%})"


def is_whole(content: bytes | str, complete: bytes | str | None) -> bool:
    """Whether ``content`` is a whole file of the kind the uninterrupted run wrote (``complete``): the same for a
    folder or link, a JSON document or a CSV of as many rows, a PNG that decodes; measured timings may differ."""
    if complete is None or isinstance(content, str) or isinstance(complete, str):
        return content == complete
    if complete.startswith(b"\x89PNG"):
        with contextlib.suppress(Exception):
            return Image.open(io.BytesIO(content)).verify() is None
        return False
    if complete.lstrip().startswith(b"{"):
        with contextlib.suppress(ValueError):
            return isinstance(json.loads(content), dict)
        return False
    lines = content.decode(errors="replace").splitlines()
    return len(lines) == len(complete.decode(errors="replace").splitlines()) and content.endswith(b"\n")


def test_rebuild_reports_check_on_a_page_that_is_not_utf8_is_one_line(tmp_path):
    import rebuild_reports

    page = tmp_path / "page.md"
    page.write_bytes(b"# a page\n\xff\xfe not UTF-8\n")
    with pytest.raises(PosGPTError, match="page.md: not valid UTF-8 at byte 9"):
        rebuild_reports.rebuild_docs([page], check=True)


# The user's own data is refused before anything is written: datasets' cache, the token cache, the run.


@pytest.mark.slow
@pytest.mark.parametrize(
    "rows",
    [
        [{"body": "no text field here"}, {"body": "nor here"}],  # the column is absent
        [{"text": "one row has it"}, {"body": "x"}, {"body": "y"}],  # most rows have no text
    ],
)
def test_a_table_without_its_text_is_refused_before_any_cache_is_written(cli, tmp_path, rows):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "cache").mkdir()
    before = tree(tmp_path)
    done = cli.here(
        "train.py", *cli.overrides(tmp_path / "run", f"data.files=[{corpus}]"), f"data.cache_dir={tmp_path / 'cache'}"
    )
    assert_one_line_error(done, "'text'")
    assert tree(tmp_path) == before


@pytest.mark.slow
def test_a_resume_on_an_edited_corpus_is_refused_before_the_run_is_written(cli, tmp_path):
    corpus, run = tmp_path / "corpus.txt", tmp_path / "run"
    corpus.write_text(cli.corpus.read_text())
    overrides = [arg if not arg.startswith("data.files=") else f"data.files=[{corpus}]" for arg in cli.overrides(run)]
    assert cli.here("train.py", *overrides, "train.max_steps=2").returncode == 0
    corpus.write_text(cli.corpus.read_text() + "\nedited\n")
    before = tree(run)
    done = cli.here("train.py", *overrides, "train.resume=true", "train.max_steps=4")
    assert_one_line_error(done, "holds other tokens than the checkpoint was trained on")
    assert tree(run) == before
