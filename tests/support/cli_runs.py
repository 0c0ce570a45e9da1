"""Run posgpt's command lines (train.py, eval.py, torchrun) as a user would, on a tiny model and corpus.

Shared by the tests of the command lines. A step takes a few milliseconds, so most of a subprocess's time is
Python importing torch (~3 s): a command whose answer does not depend on being a process of its own (a refusal,
a short run) runs in-process instead (Runner.here), exactly as ``python <script> <argv>`` would run it.

Session fixtures (read-only: a test that changes a run copies it first, shutil.copytree):
    cli        the Runner of the session (its corpus and token cache)
    reference  an uninterrupted run of STEPS steps of the TINY model (pe=learned), = reference_run(cli)
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import runpy
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from types import ModuleType

import pytest
import torch

from core.tracking import read_metrics

REPO = Path(__file__).resolve().parents[2]

# One CPU thread, one layer, 16-dim embeddings. A warmup longer than any run here keeps the learning rate a
# function of the step alone, so runs that end at different max_steps train identically up to their end.
# pe=learned: the reference run then also serves the test of evaluating beyond the learned table.
TINY = [
    "pe=learned",
    "data=text",
    "model.n_layer=1",
    "model.n_embd=16",
    "model.n_head=2",
    "train.seq_len=16",
    "train.batch_size=4",
    "train.num_threads=1",
    "train.log_every=1",
    "train.warmup_steps=1000",
    "train.val_batches=2",
    "train.eval_after=false",
    "logging.wandb.mode=disabled",
    "logging.progress=false",
]
STEPS = 40  # the reference run's length
TIMEOUT_S = 300  # generous: the 2 CPU cores are shared


class Runner:
    """Subprocess runs inside one pytest session's temporary directory, sharing its token cache."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.corpus = base / "corpus.txt"
        if not self.corpus.exists():  # ~25k tokens of Python: enough for seq_len 16 and a val split
            self.corpus.write_text((Path(sysconfig.get_paths()["stdlib"]) / "argparse.py").read_text()[:60_000])
        self.env = {**os.environ, "POSGPT_CACHE_DIR": str(base / "posgpt-cache"), "OMP_NUM_THREADS": "1"}

    def overrides(self, run_dir: Path, *extra: str) -> list[str]:
        """TINY and the corpus, unless ``extra`` chooses a task (which makes its own data: data.* is refused)."""
        task = any(arg.startswith("task=") and arg != "task=none" for arg in extra)
        data = [] if task else [f"data.files=[{self.corpus}]"]
        return [
            *(arg for arg in TINY if not (task and arg.startswith("data"))),
            *data,
            f"hydra.run.dir={run_dir}",
            *extra,
        ]

    def run(self, command: list[str], timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
        """The command's result. Whatever it answers, nothing a library prints at interpreter shutdown may follow it
        (nanobind's leak report, which a Triton newer than the torch build's own printed from every process that
        imported torch._dynamo: requirements-dev.txt keeps Triton within what torch 2.13 pins)."""
        result = subprocess.run(command, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout)
        assert "nanobind: leaked" not in result.stderr, f"library noise at exit: {result.stderr[-300:]}"
        return result

    def train(self, run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
        return self.run([sys.executable, "train.py", *self.overrides(run_dir, *extra)])

    def torchrun(self, run_dir: Path, *extra: str, nproc: int = 2) -> subprocess.CompletedProcess:
        """train.py under torchrun with ``nproc`` CPU workers. A launch that lost a worker to a signal before the run
        logged a step is tried once more, said so on stderr: torch's launcher did that once in about 30 full suites,
        under load (rank 1 SIGABRT, "terminate called without an active exception", at start-up; not in 20 runs of
        the test alone), and a run killed there leaves nothing that a second launch in its directory trips on. Any
        other failure, and one after a step, is returned as it is."""
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        command += ["train.py", *self.overrides(run_dir, *extra)]
        steps = len(train_losses(run_dir))
        result = self.run(command)
        if result.returncode != 0 and "traceback : Signal " in result.stderr and len(train_losses(run_dir)) == steps:
            print(
                f"torchrun lost a worker to a signal before a step; launched once more. It said:\n{result.stderr}",
                file=sys.stderr,
            )
            result = self.run(command)
        return result

    def eval(self, run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
        return self.run([sys.executable, "eval.py", f"run_dir={run_dir}", *extra])

    def here(self, script: str, *argv: str) -> subprocess.CompletedProcess:
        """``python <script> <argv>`` run in this process (as __main__, with the real sys.argv), its output and
        exit code returned as a subprocess's would be: a refusal or a short run without the cost of a process.
        What the script changes for the whole process (output streams, threads, gradients, cwd) is restored. It
        runs in this process's environment, not self.env: conftest.py points the token cache where the session
        Runner's is."""
        stdout, stderr = io.StringIO(), io.StringIO()
        saved = sys.argv, os.getcwd(), torch.get_num_threads(), torch.is_grad_enabled()
        code = 0
        try:
            os.chdir(REPO)
            sys.argv = [str(REPO / script), *argv]
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                runpy.run_path(str(REPO / script), run_name="__main__")
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
        finally:
            sys.argv, cwd, threads, grad = saved
            os.chdir(cwd)
            torch.set_num_threads(threads)
            torch.set_grad_enabled(grad)
        return subprocess.CompletedProcess([script, *argv], code, stdout.getvalue(), stderr.getvalue())

    def train_here(self, run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
        """train.py in this process (see here)."""
        return self.here("train.py", *self.overrides(run_dir, *extra))

    def eval_here(self, run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
        """eval.py in this process (see here)."""
        return self.here("eval.py", f"run_dir={run_dir}", *extra)

    def start_interruptible(self, command: list[str]) -> subprocess.Popen:
        """``command`` started with SIGINT as a terminal delivers it, whatever this test inherits: a shell's
        background job (`pytest &`, nohup) starts with SIGINT ignored, which Python keeps (Ctrl-C would do nothing)."""
        return subprocess.Popen(
            command,
            cwd=REPO,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )

    def start_train(self, run_dir: Path, *extra: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "train.py", *self.overrides(run_dir, *extra)],
            cwd=REPO,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )


_REFERENCES: dict[Path, Path] = {}


def reference_run(runner: Runner) -> Path:
    """An uninterrupted single-process run of STEPS steps, made once per session (a read-only fixture)."""
    if runner.base not in _REFERENCES:
        run_dir = runner.base / "reference"
        done = runner.train_here(run_dir, f"train.max_steps={STEPS}")
        assert done.returncode == 0, done.stderr
        _REFERENCES[runner.base] = run_dir
    return _REFERENCES[runner.base]


@pytest.fixture(scope="session")
def cli(tmp_path_factory) -> Runner:
    return Runner(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def reference(cli) -> Path:
    """reference_run(cli) as a fixture: read it, never write into it (copy it first)."""
    return reference_run(cli)


def load_script(name: str) -> ModuleType:
    """scripts/<name>.py imported as the module ``name`` (once per session), to call its functions."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before running it: dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


def train_losses(run_dir: Path) -> dict[int, float | None]:
    """step -> logged training loss (None where it was not finite)."""
    return {record["step"]: record["train_loss"] for record in read_metrics(run_dir) if "train_loss" in record}


def wait_for_step(process: subprocess.Popen, run_dir: Path, step: int) -> None:
    """Block until the run has logged ``step`` (it logs every step)."""
    deadline = time.monotonic() + TIMEOUT_S
    while max(train_losses(run_dir), default=0) < step:
        assert process.poll() is None, f"the run ended before step {step}:\n{process.stdout.read()}"
        assert time.monotonic() < deadline, f"no step {step} after {TIMEOUT_S} s"
        time.sleep(0.02)


def assert_user_error(done: subprocess.CompletedProcess, *fragments: str) -> None:
    """A clear, short error: non-zero exit, the fragments in stderr, and no traceback."""
    assert done.returncode != 0, done.stdout
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output
    for fragment in fragments:
        assert fragment in done.stderr, done.stderr


def assert_one_line_error(done: subprocess.CompletedProcess, *fragments: str) -> None:
    """posgpt's user-error form: exit code 2 and a single ``error: ...`` line on stderr holding the fragments."""
    assert_user_error(done, *fragments)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr


def evaluated_run(runner: Runner, directory: Path) -> Path:
    """A run with results in ``directory``/run: a checkpoint of untrained weights (tests/support/tiny_checkpoint.py),
    evaluated at one length."""
    from tiny_checkpoint import make_run

    run_dir = make_run(directory / "run", runner.corpus)
    done = runner.eval_here(run_dir, "eval.lengths=[16]", "eval.protocols=[nonoverlapping]")
    assert done.returncode == 0, done.stderr
    return run_dir
