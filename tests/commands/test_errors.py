"""Bad input gets one clear line and a non-zero exit, never a traceback, and nothing of an existing run is
overwritten (not even its record of how it was made, .hydra/, nor its console log); a diverging run stops (or
skips the step) and keeps its last good checkpoint. Every case is a train.py or eval.py command line, run
in-process as ``python <script> <argv>`` would run it (cli.here: the same exit code and output, without ~3 s
of importing torch per case); the unknown scheme and the closed pipe are real subprocesses."""

import json
import shutil
import subprocess
import sys

import pytest
import torch
from cli_runs import REPO, STEPS, assert_one_line_error, assert_user_error, train_losses

from model import GPT

pytestmark = pytest.mark.slow  # every case reads or copies the session's trained reference run, or trains


@pytest.fixture(scope="module")
def existing_run(reference, tmp_path_factory):
    """A finished run's directory; every bad command below is aimed at it and must leave it as it was."""
    run_dir = tmp_path_factory.mktemp("errors") / "existing"
    shutil.copytree(reference, run_dir)
    record = [run_dir / ".hydra" / "config.yaml", run_dir / ".hydra" / "overrides.yaml", run_dir / "train.log"]
    checkpoints = sorted((run_dir / "checkpoints").iterdir())
    files = [*checkpoints, run_dir / "metrics.jsonl", *record]
    before = {path: path.read_bytes() for path in files}
    log = before[run_dir / "train.log"].decode()  # the console log, from the data's lines (printed before the
    assert log.startswith("data: ") and "train: pe=learned" in log  # run directory may be written) on
    yield run_dir
    assert sorted((run_dir / "checkpoints").iterdir()) == checkpoints
    assert all(path.read_bytes() == content for path, content in before.items())


def test_unknown_scheme_lists_the_options(cli, existing_run):
    done = cli.train_here(existing_run, "pe=fourier")
    options = ", ".join(sorted(path.stem for path in (REPO / "configs" / "pe").glob("*.yaml")))
    assert_one_line_error(done, "Could not find 'pe/fourier'", f"Available options in 'pe': {options}")


@pytest.mark.parametrize("override", ["pe=1", "model=false", "data=null", "model={}", "pe=[rope,3]"])
def test_a_group_chosen_by_something_not_a_name_is_refused(cli, existing_run, override):
    # Hydra's bare ValueError (a traceback, exit 1) for a number, a bool or null; a mapping composed the defaults
    group = override.split("=")[0]
    done = cli.train_here(existing_run, override)
    assert_one_line_error(done, f"{override}: {group} chooses a file of configs/{group}/")


def test_a_sweep_or_a_script_choosing_a_group_by_a_number_is_refused(cli, existing_run):
    done = cli.train_here(existing_run, "-m", "pe=rope,3")
    assert_one_line_error(done, "pe=rope,3: pe chooses a file of configs/pe/")
    done = cli.here("scripts/estimate.py", "model=3")
    assert_one_line_error(done, "model=3: model chooses a file of configs/model/ by name (gpt2, tiny, tiny_wide)")


@pytest.mark.parametrize(
    "override, message",
    [
        ("+train.lerning_rate=3e-4", "unknown config key train.lerning_rate"),  # the `+` Hydra's own message suggests
        ("train.lerning_rate=3e-4", "Key 'lerning_rate' not in 'TrainConfig'"),
        ("train.max_steps=abc", "could not be converted to Integer"),
        ("logging.wandb=false", "(logging.wandb is a group of settings: set one of them, logging.wandb.<name>=..."),
    ],
)
def test_config_typos_never_train(cli, existing_run, override, message):
    assert_one_line_error(cli.train_here(existing_run, override), message)


@pytest.mark.parametrize("device", ["foo", "cuda:x", "mps", "xla", "cuda:99"])
def test_a_device_this_machine_lacks_is_one_line_in_every_command(cli, existing_run, tmp_path, device):
    """A typo, another kind of accelerator, a GPU index past the machine's: refused before anything is written, in
    train.py (a new run directory is not made) and in eval.py and sample.py on a finished run (left as it was)."""
    fresh = tmp_path / "fresh"
    assert_one_line_error(cli.train_here(fresh, f"train.device={device}"), "train.device=", device)
    assert not fresh.exists()
    for command in ("eval.py", "sample.py"):
        done = cli.here(command, f"run_dir={existing_run}", f"train.device={device}")
        assert_one_line_error(done, "train.device=", device)


def test_eval_of_a_checkpoint_file_says_to_pass_the_run_directory(cli, existing_run):
    done = cli.eval_here(existing_run / "checkpoints" / "last.pt")
    assert_one_line_error(done, "is a file", f"run_dir={existing_run}")
    assert "eval:" not in done.stdout  # refused before any work


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.n_embd=33"], "model.n_embd=33 is not divisible by model.n_head=2"),
        (["pe=rope", "model.n_embd=18"], "head dimension must be even"),  # 18 / 2 heads = 9
        (["train.max_steps=0"], "train.max_steps=0 is out of its domain [1, inf)"),
        (["train.seq_len=-16"], "train.seq_len=-16 is out of its domain [1, inf)"),
    ],
)
def test_bad_config(cli, existing_run, overrides, message):
    assert_user_error(cli.train_here(existing_run, *overrides), message)


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("missing.txt", None, "does not exist"),
        ("empty.txt", b"", "is empty"),
        ("binary.txt", b"\xff\xfe\x00\x81 not UTF-8 text", "could not read"),
        ("short.txt", b"word " * 200, "the val split has"),  # too short for one window: was found at the first batch
    ],
)
def test_bad_data_file(cli, tmp_path, name, content, message):
    """Refused before the run directory is written: a rerun with the file mended starts clean."""
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    assert_one_line_error(cli.train_here(tmp_path / "run", f"data.files=[{path}]"), message)
    assert not (tmp_path / "run").exists()


def test_fresh_run_refuses_an_existing_run_directory(cli, existing_run):
    done = cli.train_here(existing_run, "train.max_steps=5")
    assert_user_error(done, "already holds a checkpoint", "train.resume=true")


def test_resume_with_another_architecture_is_refused(cli, existing_run):
    done = cli.train_here(existing_run, f"train.max_steps={STEPS}", "train.resume=true", "model.n_embd=32")
    assert_user_error(done, "cannot resume", "model.n_embd=16 (now 32)")


def test_truncated_checkpoint(cli, reference, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    last = run_dir / "checkpoints" / "last.pt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    done = cli.train_here(run_dir, f"train.max_steps={STEPS + 5}", "train.resume=true")
    assert_user_error(done, "is truncated or not a posgpt checkpoint")


def test_foreign_checkpoint(cli, tmp_path):
    (tmp_path / "checkpoints").mkdir()
    torch.save({"state_dict": {"weight": torch.zeros(3)}}, tmp_path / "checkpoints" / "last.pt")
    assert_user_error(cli.eval_here(tmp_path), "is not a posgpt checkpoint")


def test_eval_of_a_run_directory_without_checkpoint(cli, tmp_path):
    assert_user_error(cli.eval_here(tmp_path), "no checkpoint at")


def test_eval_beyond_a_learned_table_reports_null_ppl(cli, existing_run):
    done = cli.eval_here(existing_run, "eval.lengths=[16,32]", "eval.protocols=[nonoverlapping]")
    assert done.returncode == 0, done.stderr
    results = json.loads((existing_run / "eval" / "extrapolation.json").read_text())["results"]
    rows = {row["length"]: row for row in results}
    assert rows[16]["ppl"] is not None  # the training length
    assert rows[32]["ppl"] is None and "at most 16 positions" in rows[32]["reason"]


def assert_finite_weights(checkpoint):
    assert all(torch.isfinite(value).all() for value in checkpoint["model"].values() if value.is_floating_point())


@pytest.fixture
def nan_at_step(monkeypatch):
    """``nan_at_step(k)``: the loss of the k-th training step of this process is NaN, and so are its gradients.

    A diverging learning rate (train.lr=1e6) overflows at a step that depends on the CPU's rounding (step 2 on
    one machine, 4 on another): the non-finite step is made here instead, the same everywhere."""

    def poison(step: int) -> None:
        forward, steps = GPT.forward, []

        def forward_with_nan(self, *args, **kwargs):
            loss = forward(self, *args, **kwargs)
            if torch.is_grad_enabled() and self.training:  # a training step (validation, and the check of the first
                # forward before the run is written, run in eval mode)
                steps.append(None)
                if len(steps) == step:
                    return loss * float("nan")
            return loss

        monkeypatch.setattr(GPT, "forward", forward_with_nan)

    return poison


def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(cli, reference, tmp_path, nan_at_step):
    # Step 4's NaN gradients turn the weights NaN; a save after every step would write them if anything let it.
    # (The reference run has tokenized the corpus: a cold token cache's progress bar would stand above the error.)
    nan_at_step(4)
    done = cli.train_here(tmp_path, "train.max_steps=20", "train.checkpoint_every=1")
    assert_one_line_error(done, "non-finite by step 4", "still holds the last good checkpoint", "Lower train.lr")
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert checkpoint["step"] == 3
    assert_finite_weights(checkpoint)


def test_skip_nonfinite_skips_the_step(cli, tmp_path, nan_at_step):
    nan_at_step(2)
    done = cli.train_here(tmp_path, "train.max_steps=5", "train.skip_nonfinite=true")
    assert done.returncode == 0, done.stderr
    assert "step 2: non-finite loss or gradients, step skipped" in done.stdout
    assert [step for step, loss in train_losses(tmp_path).items() if loss is None] == [2]  # logged as such
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert checkpoint["step"] == 5
    assert_finite_weights(checkpoint)


@pytest.mark.parametrize("skip", ["false", "true"])
def test_a_nonfinite_loss_before_any_update_is_refused_whatever_skip_nonfinite_says(
    cli, tmp_path, nan_at_step, skip, recwarn
):
    """The weights the run starts from overflow (pe=xpos pe.scale_base=1e-300, pe=fire pe.init_c=1e300): the
    message blamed train.lr, and with train.skip_nonfinite=true every step was skipped and the run ended, trained
    nothing and scored n/a, with exit 0."""
    nan_at_step(1)
    done = cli.train_here(tmp_path, "train.max_steps=5", f"train.skip_nonfinite={skip}", "pe.max_positions=16")
    assert_one_line_error(done, "non-finite at step 1, before any update", "(this command sets", "pe.max_positions")
    assert not (tmp_path / "checkpoints").exists()
    assert not [w for w in recwarn if "lr_scheduler" in str(w.message)]  # a skipped step before any optimizer step


def test_output_piped_to_a_reader_that_stops_early_ends_quietly(cli, existing_run):
    """`eval.py ... | head -0`: the reader is gone before the first line; no traceback, exit 1."""
    process = subprocess.Popen(
        [sys.executable, "eval.py", f"run_dir={existing_run}"],
        cwd=REPO,
        env=cli.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    process.stdout.close()  # before the command writes anything
    stderr = process.stderr.read()
    assert process.wait(timeout=120) == 1 and "Traceback" not in stderr, stderr


def test_an_interrupt_a_library_swallowed_ends_in_one_line_not_its_later_failure(cli):
    """Ctrl-C landing while a library imports may be swallowed there and surface later as another error (numpy half
    initialised: an AttributeError at its first use). After a SIGINT, what escapes is that interrupt: one line, 130."""
    code = (
        "import core.interrupts, signal\n"
        "try:\n    signal.raise_signal(signal.SIGINT)\nexcept KeyboardInterrupt:\n    pass\n"
        "raise AttributeError(\"module 'numpy' has no attribute 'iterable'\")\n"
    )
    process = cli.start_interruptible([sys.executable, "-c", code])  # SIGINT as a terminal delivers it
    _, stderr = process.communicate(timeout=60)
    assert (process.returncode, stderr) == (130, "interrupted\n")
