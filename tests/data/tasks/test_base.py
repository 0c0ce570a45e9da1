"""Training on every length up to the training length (data/tasks/base.py ``training_batch``; Ruoss et al. 2023,
Kazemnejad et al. 2023): the lengths drawn, the padding never seen nor scored, the old fixed-length stream kept
bit for bit, checkpoints without the setting read as fixed, and a trained passkey run holding its 1x accuracy
below 1x (through the real command line)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from cli_runs import assert_one_line_error, load_script

from core.errors import PosGPTError
from data import draw_batch
from data.tasks import TASKS, build_task
from data.tasks.mqar import MQARConfig
from data.tasks.passkey import PasskeyConfig
from experiment.compose import compose_config
from experiment.config import eval_lengths, validate
from experiment.eval_checks import check_eval_settings
from experiment.settings import trained_config
from model import GPT
from model.gpt import ModelConfig
from model.pe import SCHEMES


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def recorded_lengths(task, monkeypatch) -> list[tuple[int, dict]]:
    """The (length, settings) ``generate`` is asked for, one entry per instance."""
    calls: list[tuple[int, dict]] = []
    generate = task.generate

    def spy(batch, length, generator, **cell):
        calls.extend([(length, cell)] * batch)
        return generate(batch, length, generator, **cell)

    monkeypatch.setattr(task, "generate", spy)
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TASKS))
def test_training_instances_take_every_length_the_format_fits_uniformly(name, monkeypatch):
    task = build_task(TASKS[name].config_class())
    lengths = recorded_lengths(task, monkeypatch)
    generator, seq_len = gen(), 40  # MQAR's dataclass default: 8 pairs, 32 tokens at least
    for _ in range(300):
        task.training_batch(16, seq_len, generator)
    counts = Counter(length for length, _ in lengths)
    low = task.min_length()
    assert set(counts) == set(range(low, seq_len + 2))  # from the shortest the format fits to seq_len + 1 tokens
    expected = len(lengths) / (seq_len + 2 - low)  # uniform: each within 30% of its expected count (fixed seed)
    assert all(abs(n - expected) < 0.3 * expected for n in counts.values()), counts


def test_mqar_lengths_fit_the_pairs_each_batch_draws(monkeypatch):
    task = build_task(MQARConfig(n_pairs=8, min_pairs=2))
    seen = recorded_lengths(task, monkeypatch)
    generator = gen()
    for _ in range(200):
        task.training_batch(8, 48, generator)
    assert all(length >= 4 * cell["n_pairs"] for length, cell in seen)
    assert {length for length, cell in seen if cell["n_pairs"] == 2} >= set(range(8, 20))


@pytest.mark.parametrize("name", sorted(TASKS))
def test_a_shorter_instance_starts_at_position_0_and_its_pads_are_never_targets(name, monkeypatch):
    task = build_task(TASKS[name].config_class())
    made: list[tuple[torch.Tensor, torch.Tensor]] = []
    generate = task.generate
    monkeypatch.setattr(task, "generate", lambda *a, **k: made.append(generate(*a, **k)) or made[-1])
    x, y = task.training_batch(32, 64, gen(3))
    instances = [(t, a) for tokens, answer in made for t, a in zip(tokens, answer)]
    assert len(instances) == 32
    for tokens, answer in instances:  # each instance is some row's prefix, with its own targets, then -100 only
        length = len(tokens)
        rows = [i for i in range(32) if torch.equal(x[i, : length - 1], _inputs(task, tokens, answer))]
        assert rows, "an instance is not the prefix of any row"
        targets = tokens[1:].masked_fill(~answer[1:], -100)
        assert any(torch.equal(y[i, : length - 1], targets) and (y[i, length - 1 :] == -100).all() for i in rows)


def _inputs(task, tokens: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    inputs = tokens[:-1]
    return inputs if task.answer_input is None else inputs.masked_fill(answer[:-1], task.answer_input)


@pytest.mark.parametrize("name", sorted(SCHEMES))
@torch.no_grad()
def test_every_scheme_computes_a_padded_instance_as_it_would_alone(name):
    """Pads follow the instance, so under causal attention (and positions from 0) no scheme's output at the
    instance's positions depends on them: a shorter training instance is trained as if it were alone."""
    task = build_task(PasskeyConfig())
    x, y = task.training_batch(8, 64, gen(1))
    torch.manual_seed(0)
    model = GPT(
        ModelConfig(n_layer=2, n_head=4, n_embd=32, vocab_size=task.vocab_size),
        SCHEMES[name].config_class(),
        train_seq_len=64,
    ).eval()
    padded = model(x)
    for row in range(8):
        length = int((y[row] != -100).nonzero().max()) + 1  # the instance ends on its last answer
        alone = model(x[row : row + 1, :length])
        torch.testing.assert_close(padded[row : row + 1, :length], alone, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_fixed_lengths_are_the_old_stream_bit_for_bit(name):
    cls = TASKS[name]
    task = build_task(cls.config_class(train_lengths="fixed"))
    generator, old = gen(5), gen(5)
    for _ in range(3):
        x, y = task.training_batch(8, 64, generator)
        cell = task.training_cell(old)  # what a training batch drew before train_lengths existed
        x_old, y_old = task.sample(8, 64, old, **cell)
        assert torch.equal(x, x_old) and torch.equal(y, y_old)


def test_validation_batches_stay_at_the_training_length():
    task = build_task(PasskeyConfig())
    _, y = draw_batch(task, 16, 64, gen())
    assert (y[:, -1] != -100).all()  # every instance ends at seq_len on its answer


def test_a_checkpoint_without_the_setting_was_trained_at_fixed_length():
    cfg = compose_config(["task=passkey"])
    assert cfg.task.train_lengths == "uniform"
    saved = json.loads(json.dumps(dict(_container(cfg))))
    del saved["task"]["train_lengths"]
    assert trained_config(saved).task.train_lengths == "fixed"
    lm = _container(compose_config([]))
    assert "train_lengths" not in trained_config(lm).task  # language modelling has no such setting


def _container(cfg):
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)


def test_an_unknown_length_distribution_is_refused():
    with pytest.raises(PosGPTError, match="task.train_lengths='random' is not one of its choices: uniform, fixed"):
        validate(compose_config(["task=copy", "task.train_lengths=random"]))
    with pytest.raises(PosGPTError):
        compose_config(["task.train_lengths=fixed"])  # language modelling: not a key of task=none


def test_a_multiplier_that_rounds_below_one_token_is_refused():
    cfg = compose_config(["eval.length_multipliers=[0.001]"])
    validate(cfg)  # in its domain; what it gives at the training length is the evaluation settings' check
    with pytest.raises(PosGPTError, match=r"eval.length_multipliers=\[0.001\] gives a length below one token"):
        check_eval_settings(cfg)
    with pytest.raises(PosGPTError, match="out of its domain"):
        validate(compose_config(["eval.length_multipliers=[0]"]))


def test_the_task_grid_scores_below_the_training_length():
    cfg = compose_config(["task=passkey"])
    assert eval_lengths(cfg) == [32, 48, 64, 128, 256, 512, 1024]
    assert eval_lengths(compose_config(["task=passkey", "train.seq_len=30"]))[:3] == [15, 22, 30]


SMALL_PASSKEY = [  # passkey at half its length, with its own model: learns in ~20 s of one CPU thread
    "task=passkey",
    "pe=rope",
    "train.seq_len=32",
    "task.key_len=2",
    "task.filler_len=3",
    "model.n_layer=2",
    "model.n_embd=64",
    "model.n_head=4",
    "train.batch_size=32",
    "train.max_steps=600",
    "train.warmup_steps=50",
    "train.log_every=100",
    "train.eval_after=true",
    "eval.lengths=[16,24,31,32]",
    "eval.task_depths=[]",
    "eval.task_half_width=0.1",
]


@pytest.fixture(scope="module")
def small_passkey(cli) -> Path:
    run = cli.base / "passkey-below-1x"
    if not (run / "eval" / "tasks.json").exists():
        done = cli.train_here(run, *SMALL_PASSKEY)
        assert done.returncode == 0, done.stderr
    return run


@pytest.mark.slow
def test_a_trained_passkey_run_holds_its_1x_accuracy_below_1x(small_passkey):
    """Through train.py: at L/2, 3L/4 and L - 1 the accuracy is at least 0.9 x the accuracy at L (which is
    learned: at least 0.9). The full-size check is scripts/check_below_length.py (docs/evaluation.md)."""
    rows = json.loads((small_passkey / "eval" / "tasks.json").read_text())["results"]
    accuracy = {row["length"]: row["accuracy"] for row in rows if row.get("depth") is None}
    assert accuracy[32] >= 0.9, accuracy
    for shorter in (16, 24, 31):
        assert accuracy[shorter] >= 0.9 * accuracy[32], accuracy


@pytest.mark.slow
def test_the_check_script_scores_a_run_below_1x_and_refuses_a_language_model_run(cli, small_passkey, reference):
    done = cli.run([sys.executable, "scripts/check_below_length.py", str(small_passkey)])
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.strip().splitlines()
    assert header.split()[:8] == ["run", "task", "pe", "train_lengths", "L/2", "3L/4", "L-1", "L"]
    assert row.split()[1:4] == ["passkey", "rope", "uniform"] and row.split()[-1] == "yes"
    assert_one_line_error(cli.here("scripts/check_below_length.py", str(reference)), "is a language-model run")
    assert_one_line_error(cli.here("scripts/check_below_length.py", "--min-ratio", "0", str(small_passkey)), "(0, 1]")


def test_a_run_that_fails_below_1x_does_not_hold():
    check = load_script("check_below_length")
    setting = {"task": "passkey", "pe": "rope", "train_lengths": "fixed", "L": 64}
    failed = check.verdict(setting, {"L/2": 0.29, "3L/4": 0.45, "L-1": 0.46, "L": 1.0}, 0.9)
    assert not failed["holds"] and failed["lowest_ratio"] == pytest.approx(0.29)
    held = check.verdict(setting, {"L/2": 0.95, "3L/4": 0.9, "L-1": 1.0, "L": 1.0}, 0.9)
    assert held["holds"] and not check.verdict(setting, {"L/2": 0, "3L/4": 0, "L-1": 0, "L": 0.0}, 0.9)["holds"]
    assert check.checked_lengths(64) == {"L/2": 32, "3L/4": 48, "L-1": 63, "L": 64}
