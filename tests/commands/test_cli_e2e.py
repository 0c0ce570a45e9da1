"""End to end through the real command lines: train.py then eval.py, for every positional scheme.

Every scheme trains in one sweep (``train.py -m pe=...``, one process: a process per scheme would spend most
of its time importing torch); each run is then evaluated by eval.py in-process (cli.here), as
``python eval.py run_dir=...`` would. (tests/commands/test_errors.py shows the in-process answers are the command
line's.)
"""

import json
import math
import shutil
import sys
import sysconfig
from pathlib import Path

import pytest
from cli_runs import REPO, assert_user_error

from core.tracking import read_metrics
from model.pe import SCHEMES


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[str]:
    """A few standard-library modules as plain-text documents: real code and prose, present everywhere."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    directory = tmp_path_factory.mktemp("corpus")
    paths = []
    for name in ["argparse", "textwrap", "string", "fractions", "calendar", "difflib"]:
        target = directory / f"{name}.txt"
        target.write_text((stdlib / f"{name}.py").read_text())
        paths.append(str(target))
    return paths


pytestmark = pytest.mark.slow


def small_run(files: list[str], *extra: str, layers: int = 1) -> list[str]:
    """train.py's arguments for a model and run small enough for a few seconds of CPU."""
    return [
        "data=text",
        f"data.files=[{','.join(files)}]",
        "data.val_fraction=0.2",
        f"model.n_layer={layers}",
        "model.n_head=2",
        "model.n_embd=32",
        "train.seq_len=16",
        "train.batch_size=16",
        "train.max_steps=12",
        "train.warmup_steps=0",
        "train.lr=1e-2",
        "train.log_every=1",
        "train.val_every=4",
        "train.val_batches=2",
        "train.checkpoint_every=4",
        "eval.max_tokens=256",
        "logging.progress=false",
        *extra,
    ]


@pytest.fixture(scope="module")
def sweep(corpus, cli, tmp_path_factory) -> Path:
    """One sweep over every scheme; its runs are <sweep>/<job number>-<scheme>."""
    sweep_dir = tmp_path_factory.mktemp("e2e") / "sweep"
    # train.compile=false exactly as docs/configuration.md documents it (Hydra makes it a boolean)
    schemes = ",".join(sorted(SCHEMES))
    # four layers: a per-layer pattern (rnope) is refused on fewer layers than it has entries; 8 sequences a step:
    # the 50,257-logit head is most of a step, and every scheme still drops its loss by > 2 nats in 12 steps; one
    # checkpoint, at the end (what is read here; periodic saves are the resume tests' business)
    # W&B off: its logging does not depend on the scheme, and the default job below logs offline, as
    # `python train.py` does
    extra = ("train.eval_after=false", "train.compile=false", "train.batch_size=8", "train.checkpoint_every=12")
    extra += ("logging.wandb.mode=disabled",)
    overrides = small_run(corpus, f"pe={schemes}", *extra, layers=4)
    ok(cli.run([sys.executable, "train.py", "-m", *overrides, f"hydra.sweep.dir={sweep_dir}"]))
    return sweep_dir


def ok(done):
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    return done


def repository_copy(destination: Path) -> Path:
    """The code and configs/ of this checkout, to edit a YAML file without touching the real one."""
    shutil.copytree(
        REPO,
        destination,
        ignore=shutil.ignore_patterns(
            ".git", "tests", "outputs", "multirun", "docs", "results", "bench", "__pycache__"
        ),
    )
    return destination


@pytest.mark.parametrize("pe", sorted(SCHEMES))
@pytest.mark.e2e
def test_train_then_eval_every_scheme(pe, sweep, cli, tmp_path):
    (run_dir,) = sweep.glob(f"*-{pe}")
    assert (run_dir / "checkpoints" / "last.pt").is_file()
    metrics = read_metrics(run_dir)
    train_losses = [m["train_loss"] for m in metrics if "train_loss" in m]
    val_losses = [m["val_loss"] for m in metrics if "val_loss" in m]
    assert [m["step"] for m in metrics if "train_loss" in m] == list(range(1, 13))
    assert all(math.isfinite(loss) for loss in train_losses + val_losses)
    assert sum(train_losses[-3:]) / 3 < train_losses[0] - 0.5, train_losses
    assert len(val_losses) == 3 and val_losses[-1] < val_losses[0], val_losses
    assert all(m["tokens_per_s"] > 0 for m in metrics if "train_loss" in m)
    assert not (run_dir / "wandb").exists()  # logging.wandb.mode=disabled writes nothing

    result = ok(
        cli.eval_here(run_dir, "eval.length_multipliers=[1,4]", "eval.max_tokens=256", "logging.progress=false")
    )
    assert "1×" in result.stdout and "4×" in result.stdout  # the table is printed
    document = json.loads((run_dir / "eval" / "extrapolation.json").read_text())
    assert document["pe"] == pe and document["train_seq_len"] == 16
    rows = {(r["length"], r["protocol"]): r for r in document["results"]}
    assert {length for length, _ in rows} == {16, 64}
    assert math.isfinite(rows[(16, "nonoverlapping")]["ppl"])
    assert rows[(16, "nonoverlapping")]["tokens"] > 0
    four_x = rows[(64, "nonoverlapping")]
    if pe == "learned":
        assert four_x["ppl"] is None and "16 positions" in four_x["reason"]
    else:
        assert math.isfinite(four_x["ppl"]) and four_x["ppl"] > 1
    if pe == "rope":
        assert_evaluation_follows_the_checkpoint(cli, run_dir, tmp_path, rows)
    if pe == "learned":  # a key of the scheme that is not an evaluation-time setting: refused, no traceback
        assert_user_error(cli.eval_here(run_dir, "pe.max_positions=64"), "pe.max_positions cannot be changed")


def assert_evaluation_follows_the_checkpoint(cli, run_dir, tmp_path, rows):
    """The model comes from the checkpoint's config: another pe.base is refused, naming it; a configs/ YAML
    edited after training changes nothing; an evaluation-time setting (RoPE's pe.scaling) is allowed."""
    assert_user_error(cli.eval_here(run_dir, "pe.base=500000"), "pe.base cannot be changed", "pe.base=10000")
    copy = repository_copy(tmp_path / "repo")
    rope_yaml = copy / "configs" / "pe" / "rope.yaml"
    rope_yaml.write_text(rope_yaml.read_text() + "base: 500000.0\n")  # the yaml holds only what differs from the schema
    again = ok(
        cli.run(
            [
                sys.executable,
                str(copy / "eval.py"),
                f"run_dir={run_dir}",
                "eval.length_multipliers=[1,4]",
                "eval.max_tokens=256",
                "logging.progress=false",
                "pe.scaling.type=linear",
                "pe.scaling.factor=1.0",
            ]
        )
    )
    assert "pe=rope" in again.stdout
    document = json.loads((run_dir / "eval" / "extrapolation.json").read_text())
    linear = {
        (r["length"], r["protocol"]): r["ppl"]
        for r in document["results"]
        if r["variation_settings"]["scaling"]["type"] == "linear"
    }
    # linear scaling by 1.0 is the identity: the same model as trained, scored again
    assert linear == pytest.approx({key: row["ppl"] for key, row in rows.items()}, rel=1e-5)


def test_a_good_run_as_its_own_process_writes_nothing_to_stderr(cli, tmp_path):
    """What a user sees of a good run, training and its evaluation, to the process's exit: its lines on stdout and
    nothing on stderr (a library's report at interpreter shutdown shows only here, in a process of its own:
    nanobind's leak report from a Triton newer than torch's own did; tests/support/cli_runs.py refuses it in every
    run)."""
    # logging.progress=false (cli_runs.TINY) also keeps the tokenizing bar off stderr, where this process tokenizes
    done = cli.train(tmp_path / "run", "pe=rope", "train.max_steps=2", "train.eval_after=true", "eval.lengths=[16,32]")
    assert done.returncode == 0 and "pe=rope ppl" in done.stdout and done.stderr == "", done.stderr


def test_main_job_shape_trains_and_evaluates_in_one_command(corpus, cli, tmp_path):
    """python train.py ends by evaluating (train.eval_after defaults to true) and prints the table; it logs to an
    offline W&B run (logging.wandb.mode defaults to offline)."""
    run_dir = tmp_path / "run"
    result = ok(cli.here("train.py", *small_run(corpus, "pe=alibi"), f"hydra.run.dir={run_dir}"))
    assert "pe=alibi" in result.stdout and "4×" in result.stdout
    assert (run_dir / "eval" / "extrapolation.json").is_file()
    offline_runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert offline_runs and any(offline_runs[0].glob("run-*.wandb"))
