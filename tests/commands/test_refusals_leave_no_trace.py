"""A refused command writes nothing: every check runs before the first write, in each script and sample.py.

Per class of refusal (an option the runs cannot fill, a damaged input, an output path, a library's folder and W&B's
mode, a run still being written, a device the machine lacks, a stray file in a run directory), each command is run
through its real command line, in this process (Runner.here), and must answer one ``error:`` line, exit 2 (74 where
the machine will not let it write), and leave every file and folder under the test's directory as it found them,
byte for byte. The machine's refusals are simulated at os.access (tests may run as root, whom permissions do not
stop); W&B is never started.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from cli_runs import assert_one_line_error, evaluated_run
from refusals import INSPECT, TINY_MQAR, refused, tree
from tiny_checkpoint import make_run

from core.errors import IO_ERROR_EXIT_CODE, PosGPTError
from core.rundir import LOCK_FILE, RUN_MARKERS, lock_run, refuse_if_live
from core.tracking import TrackerSettings, check_wandb, wandb_login

TORN = '{"step": 1, "train_loss": 2.5}\n{"step": 2, "tra'  # a metrics log whose last line a kill cut short


def not_writable(monkeypatch, folder: Path) -> None:
    """os.access says ``folder`` may not be written (as a read-only file system or a missing permission would)."""
    real = os.access
    refused_folder = folder.absolute()

    def access(path, mode, *args, **kwargs):
        if Path(path).absolute() == refused_folder and mode & os.W_OK:
            return False
        return real(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)


def no_wandb_login(monkeypatch, tmp_path: Path) -> None:
    for variable in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))


@pytest.fixture(scope="module")
def evaluated(cli, tmp_path_factory) -> Path:
    """A run with results (untrained weights evaluated at one length): copied by each test, never written."""
    return evaluated_run(cli, tmp_path_factory.mktemp("evaluated"))


@pytest.fixture(scope="module")
def mqar(cli, tmp_path_factory) -> Path:
    """An MQAR task run (a checkpoint only): copied by each test, never written."""
    return make_run(tmp_path_factory.mktemp("mqar") / "mqar-rope-s1", cli.corpus, *TINY_MQAR)


@pytest.fixture
def run(evaluated, tmp_path) -> Path:
    """A copy of the evaluated run under the test's directory, with a validation loss logged."""
    copy = Path(shutil.copytree(evaluated, tmp_path / "run"))
    (copy / "metrics.jsonl").write_text('{"step": 1, "train_loss": 2.5, "val_loss": 2.6}\n')
    return copy


@pytest.fixture
def task_run(mqar, tmp_path) -> Path:
    return Path(shutil.copytree(mqar, tmp_path / "mqar-rope-s1"))


def results_of(run_dir: Path, folder: Path) -> Path:
    """A copy of ``run_dir``'s results in ``folder``, without what marks it a training run (RUN_MARKERS: its
    checkpoints, its record, its log): what slim_results.py slims (it refuses a training run's directory)."""
    return Path(shutil.copytree(run_dir, folder / run_dir.name, ignore=shutil.ignore_patterns(*RUN_MARKERS)))


# slim_results.py refuses a training run's directory, in one line naming it
NOT_A_RUN = "is a training run's directory"


def damaged(run_dir: Path) -> Path:
    """A copy of ``run_dir`` beside it whose checkpoint is not one."""
    copy = Path(shutil.copytree(run_dir, run_dir.parent / "damaged"))
    (copy / "checkpoints" / "last.pt").write_bytes(b"not a checkpoint")
    return copy


# An option the runs cannot fill is refused before the outputs of the options before it are written.


def test_compare_refuses_per_position_without_bins_before_the_markdown(cli, run, tmp_path):
    results = run / "eval" / "extrapolation.json"
    document = json.loads(results.read_text())
    for row in document["results"]:
        row.pop("per_position_bins", None)
    results.write_text(json.dumps(document))
    command = ("scripts/compare.py", str(run), "--markdown", str(tmp_path / "out" / "c.md"))
    refused(cli, tmp_path, (*command, "--per-position", str(tmp_path / "out" / "p.png")), "per_position_bins")


@pytest.mark.parametrize(
    "option, fragment", [("--entropy", "attention.json does not exist"), ("--val-curve", "no validation loss")]
)
def test_compare_refuses_an_option_before_any_output(cli, run, tmp_path, option, fragment):
    (run / "metrics.jsonl").write_text('{"step": 1, "train_loss": 2.5}\n')
    command = ("scripts/compare.py", str(run), "--markdown", str(tmp_path / "out" / "c.md"))
    refused(cli, tmp_path, (*command, option, str(tmp_path / "out" / "x.png")), fragment)


# A damaged input, in any run given, is refused before anything is written or printed.


def test_compare_refuses_a_results_file_cut_short(cli, run, tmp_path):
    results = run / "eval" / "extrapolation.json"
    results.write_bytes(results.read_bytes()[:-20])
    refused(cli, tmp_path, ("scripts/compare.py", str(run), "--markdown", str(tmp_path / "c.md")), "damaged")


@pytest.mark.parametrize("command", ["export", "slim"])
def test_a_torn_metrics_log_is_refused(cli, run, tmp_path, command):
    (run / "metrics.jsonl").write_text(TORN)
    export = command == "export"
    argv = (str(run), "--to", str(tmp_path / "out")) if export else (str(results_of(run, tmp_path / "exported")),)
    refused(cli, tmp_path, (f"scripts/{command}_results.py", *argv), "metrics.jsonl is damaged")


def test_slim_csv_checks_every_folder_before_writing_any(cli, run, tmp_path):
    (run / "eval" / "extrapolation.csv").unlink()
    first = results_of(run, tmp_path / "first")
    other = results_of(run, tmp_path / "other")
    (other / "eval" / "extrapolation.json").write_text("{")
    refused(cli, tmp_path, ("scripts/slim_results.py", "--csv", str(first), str(other)), "is damaged or not JSON")


@pytest.mark.parametrize(
    "script, options",
    [
        ("scripts/attention_on_value.py", ()),
        ("scripts/check_below_length.py", ()),
        ("scripts/repeated_passages.py", ("halves",)),
    ],
    ids=["attention_on_value", "check_below_length", "repeated_passages"],
)
def test_a_damaged_checkpoint_among_the_runs_is_refused_before_the_first_is_read(
    cli, run, task_run, tmp_path, script, options
):
    first = run if "repeated" in script else task_run
    refused(cli, tmp_path, (script, *options, str(first), str(damaged(first))), "checkpoint")


def test_estimate_refuses_a_record_that_is_not_a_results_file_before_any_work(cli, tmp_path):
    (tmp_path / "record.json").write_text('{"runs": 3}')
    refused(cli, tmp_path, ("scripts/estimate.py", "--record", str(tmp_path / "record.json")), "not a results file")


# An output path: over an input or another run's files, under a file, or where the machine will not let it write.


@pytest.mark.parametrize(
    "command",
    [
        lambda run, out: ("scripts/compare.py", str(run), "--markdown", str(run / "eval" / "c.md")),
        lambda run, out: ("scripts/export_results.py", str(run), "--to", str(out / "file" / "x")),
        lambda run, out: ("scripts/estimate.py", "--record", str(run / "eval" / "r.json")),
        lambda run, out: ("scripts/repeated_passages.py", "corpus", str(out / "file" / "c.jsonl")),
        lambda run, out: ("scripts/check_below_length.py", str(run), "--json", str(out / "file" / "j.json")),
    ],
    ids=["compare into a run", "export under a file", "estimate into a run", "corpus under a file", "json"],
)
def test_an_output_that_is_not_a_path_to_write_is_refused(cli, run, tmp_path, command):
    (tmp_path / "file").write_text("a file, not a folder")
    refused(cli, tmp_path, command(run, tmp_path))


@pytest.mark.parametrize(
    "command",
    [
        lambda run, out: ("scripts/compare.py", str(run), "--markdown", str(out / "c.md")),
        lambda run, out: ("scripts/export_results.py", str(run), "--to", str(out / "export")),
        lambda run, out: ("scripts/estimate.py", "--record", str(out / "r.json")),
        lambda run, out: ("scripts/repeated_passages.py", "corpus", str(out / "c.jsonl")),
        lambda run, out: ("scripts/slim_results.py", str(results_of(run, out.parent / "exported"))),
        lambda run, out: ("scripts/inspect_attention.py", f"run_dir={run}", *INSPECT),
    ],
    ids=["compare", "export", "estimate", "corpus", "slim", "inspect"],
)
def test_an_output_folder_the_machine_will_not_let_us_write_is_exit_74(cli, run, tmp_path, monkeypatch, command):
    out = tmp_path / "out"
    out.mkdir()
    argv = command(run, out)
    written = {"slim_results.py": Path(argv[-1]) / "eval", "inspect_attention.py": run / "eval"}  # else: out
    not_writable(monkeypatch, written.get(Path(argv[0]).name, out))
    refused(cli, tmp_path, argv, "cannot write in", "nothing was written", code=IO_ERROR_EXIT_CODE)


# A library's folders: W&B online without a login, and a folder that cannot hold W&B's or matplotlib's files, are
# refused before the library starts.


def test_online_wandb_without_a_login_is_refused_before_anything(cli, run, task_run, tmp_path, monkeypatch):
    no_wandb_login(monkeypatch, tmp_path)
    inspect = ("scripts/inspect_attention.py", f"run_dir={run}", *INSPECT, "logging.wandb.mode=online")
    refused(cli, tmp_path, inspect, "logging.wandb.mode=online: this machine has no W&B login")
    trained_online = make_run(tmp_path / "online", cli.corpus, *TINY_MQAR, "logging.wandb.mode=online")
    check = ("scripts/check_below_length.py", str(task_run), str(trained_online))
    refused(cli, tmp_path, check, "this machine has no W&B login")


def test_a_stray_file_named_wandb_is_refused_before_anything(cli, run, tmp_path):
    (run / "wandb").write_text("not W&B's folder")
    inspect = ("scripts/inspect_attention.py", f"run_dir={run}", *INSPECT, "logging.wandb.mode=offline")
    refused(cli, tmp_path, inspect, f"W&B's folder {run.absolute() / 'wandb'} is a file")


def test_an_offline_wandb_folder_that_cannot_be_written_is_exit_74(cli, run, tmp_path, monkeypatch):
    (run / "wandb").mkdir()
    not_writable(monkeypatch, run / "wandb")
    inspect = ("scripts/inspect_attention.py", f"run_dir={run}", *INSPECT, "logging.wandb.mode=offline")
    refused(cli, tmp_path, inspect, "W&B's folder: cannot write in", code=IO_ERROR_EXIT_CODE)


@pytest.mark.parametrize(
    "command",
    [
        lambda run, out: ("scripts/compare.py", str(run), "--markdown", str(out / "c.md")),
        lambda run, out: ("scripts/inspect_attention.py", f"run_dir={run}", *INSPECT),
    ],
    ids=["compare", "inspect"],
)
def test_a_matplotlib_folder_that_cannot_be_one_is_refused_before_matplotlib_starts(
    cli, run, tmp_path, monkeypatch, command
):
    """Not matplotlib's two lines about a temporary folder it made instead, beside the command's own."""
    (tmp_path / "file").write_text("a file, not a folder")
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "file" / "matplotlib"))
    monkeypatch.delitem(sys.modules, "matplotlib", raising=False)  # as in a fresh process, where it has not chosen
    refused(cli, tmp_path, command(run, tmp_path), "matplotlib's folder (MPLCONFIGDIR chooses another)")


def test_wandb_is_checked_without_starting_it(tmp_path, monkeypatch):
    no_wandb_login(monkeypatch, tmp_path)
    (tmp_path / "wandb").write_text("stray")
    check_wandb(TrackerSettings("disabled"), tmp_path)  # disabled W&B writes nothing: nothing to check
    with pytest.raises(PosGPTError, match="no W&B login"):
        check_wandb(TrackerSettings("online"), tmp_path)
    (tmp_path / "no-netrc").write_text("machine api.wandb.ai login user password 0123456789abcdef\n")
    assert wandb_login() == str(tmp_path / "no-netrc")
    with pytest.raises(PosGPTError, match="is a file"):  # logged in: now the folder is what is refused
        check_wandb(TrackerSettings("online"), tmp_path)


# A run still being written (its lock held) is refused by every tool that changes it or has it changed; slim_results.py
# refuses any training run's directory, held or not.


@pytest.mark.parametrize(
    "command",
    [
        lambda run, task: ("scripts/inspect_attention.py", f"run_dir={run}", *INSPECT),
        lambda run, task: ("scripts/slim_results.py", str(run)),
        lambda run, task: ("scripts/slim_results.py", "--csv", str(run)),
        lambda run, task: ("scripts/check_below_length.py", str(task)),
    ],
    ids=["inspect", "slim", "slim --csv", "check_below_length"],
)
def test_a_run_still_being_written_is_refused(cli, run, task_run, tmp_path, command):
    argv = command(run, task_run)
    held = task_run if argv[0].endswith("check_below_length.py") else run
    with lock_run(held):
        refused(cli, tmp_path, argv, NOT_A_RUN if argv[0].endswith("slim_results.py") else "is in use by")


def test_a_lock_file_no_one_holds_is_free_and_stays_as_it_is(tmp_path):
    (tmp_path / LOCK_FILE).write_text('{"pid": 1}')  # as a holder killed by kill -9 leaves it
    refuse_if_live(tmp_path)
    assert (tmp_path / LOCK_FILE).read_text() == '{"pid": 1}'
    refuse_if_live(tmp_path / "nothing here")  # a run that no one has locked yet


# A device this machine does not have is refused before anything is written.


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA has the device")
@pytest.mark.parametrize(
    "command",
    [
        lambda run, out: ("sample.py", f"run_dir={run}", "train.device=cuda"),
        lambda run, out: ("scripts/inspect_attention.py", f"run_dir={run}", *INSPECT, "train.device=cuda"),
        lambda run, out: ("scripts/estimate.py", "--measure", "--record", str(out), "train.device=cuda"),
    ],
    ids=["sample", "inspect", "estimate"],
)
def test_a_device_this_machine_lacks_is_refused(cli, run, tmp_path, command):
    refused(cli, tmp_path, command(run, tmp_path / "record.json"), "CUDA is not available")


# A stray file or folder where a run keeps one of its own entries.


@pytest.mark.parametrize(
    "stray, command, fragment",
    [
        ("eval", lambda run: ("scripts/inspect_attention.py", f"run_dir={run}", *INSPECT), "which is a file"),
        (LOCK_FILE, lambda run: ("scripts/inspect_attention.py", f"run_dir={run}", *INSPECT), "cannot lock"),
        (LOCK_FILE, lambda run: ("scripts/slim_results.py", str(run)), NOT_A_RUN),
        (LOCK_FILE, lambda run: ("scripts/check_below_length.py", str(run)), "cannot lock"),
        ("metrics.jsonl", lambda run: ("scripts/export_results.py", str(run), "--to", str(run.parent / "x")), "read"),
        ("checkpoints", lambda run: ("sample.py", f"run_dir={run}"), "no checkpoint"),
        ("checkpoints", lambda run: ("scripts/attention_on_value.py", str(run)), "no checkpoint"),
        ("checkpoints", lambda run: ("scripts/repeated_passages.py", "halves", str(run)), "no checkpoint"),
    ],
    ids=["inspect eval", "inspect lock", "slim lock", "below lock", "export metrics", "sample", "mqar", "halves"],
)
def test_a_stray_entry_in_a_run_directory_is_one_line(cli, run, task_run, tmp_path, stray, command, fragment):
    target = task_run if command(run)[0].endswith("check_below_length.py") else run
    path = target / stray
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    path.mkdir() if stray in (LOCK_FILE, "metrics.jsonl") else path.write_text("stray")
    refused(cli, tmp_path, command(target), fragment)


def test_sample_refuses_a_prompt_file_that_is_not_text_before_generating(cli, run, tmp_path):
    (tmp_path / "prompt.txt").write_bytes(b"\xff\xfe")
    prompt = f"sample.prompt_file={tmp_path / 'prompt.txt'}"
    refused(cli, tmp_path, ("sample.py", f"run_dir={run}", prompt), "not valid UTF-8")


def test_eval_refuses_what_wandb_could_not_do_before_anything(cli, run, tmp_path, monkeypatch):
    """eval.py checks W&B's mode, login and folder with its plan: before it used to start W&B (leaving its offline
    folder) and then refuse."""
    no_wandb_login(monkeypatch, tmp_path)
    evaluate = ("eval.py", f"run_dir={run}", "eval.lengths=[16]", "eval.protocols=[nonoverlapping]")
    refused(cli, tmp_path, (*evaluate, "logging.wandb.mode=online"), "logging.wandb.mode=online: this machine has no")
    (run / "wandb").write_text("not W&B's folder")
    refused(cli, tmp_path, (*evaluate, "logging.wandb.mode=offline"), "W&B's folder", "is a file")


def test_eval_check_plans_and_writes_nothing(cli, run, tmp_path):
    """eval.py --check: every refusal of the evaluation, none of its work (scripts/check_below_length.py plans every
    run's evaluation so before it scores the first)."""
    before = tree(tmp_path)
    done = cli.here("eval.py", "--check", f"run_dir={run}", "eval.lengths=[16,32]", "eval.key_tokens=true")
    assert done.returncode == 0 and "planned; nothing was scored or written" in done.stdout, done.stderr
    assert tree(tmp_path) == before
    refused(cli, tmp_path, ("eval.py", "--check", f"run_dir={run}", "eval.lengths=[16,64]", "eval.max_tokens=32"), "64")


def test_train_refuses_online_wandb_without_a_login_before_the_run_directory(cli, tmp_path, monkeypatch):
    no_wandb_login(monkeypatch, tmp_path)
    run_dir = tmp_path / "new-run"
    done = cli.train_here(run_dir, "logging.wandb.mode=online", "train.max_steps=1")
    assert_one_line_error(done, "logging.wandb.mode=online: this machine has no W&B login")
    assert not run_dir.exists()


@pytest.mark.parametrize("variation", ["rerope:32", "self_extend:4:64", "string:64:4"])
def test_eval_refuses_a_variation_past_the_training_length_before_scoring_any(cli, tmp_path, variation):
    """A remap window at or past the training length (16) is the scheme's refusal when it is applied: eval.py applies
    every variation at plan time, so the earlier ones are not scored first, and W&B leaves no folder."""
    rope = make_run(tmp_path / "rope", cli.corpus, "pe=rope")
    evaluate = ("eval.py", f"run_dir={rope}", "eval.lengths=[16]", "logging.wandb.mode=offline")
    refused(cli, tmp_path, (*evaluate, f"eval.variations=[none,{variation}]"), "must be shorter than the training")
