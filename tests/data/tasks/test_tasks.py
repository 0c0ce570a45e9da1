"""Synthetic tasks (data/tasks/): every task registered with its config file, the format, determinism and
resumability of each generator, the held-out seeds, the loss on answer tokens only, and the config group. Each task's
own generator: tests/data/tasks/test_<task>.py; their evaluation: tests/evaluation/test_task_accuracy.py and
tests/evaluation/test_copy_probe.py."""

from __future__ import annotations

import math
import re

import pytest
import torch
from omegaconf import OmegaConf
from task_cases import gen

from core.errors import PosGPTError
from data import draw_batch
from data.tasks import TASKS, build_task, held_out_seed
from data.tasks.mqar import MQARConfig
from data.tasks.passkey import PasskeyConfig
from experiment.compose import compose_config
from experiment.config import set_task_vocabulary, validate
from model.loss import lm_head_cross_entropy
from training.batch_stream import BatchStream
from training.distributed import DistInfo


def test_every_task_is_registered_with_a_config_file():
    from experiment.compose import CONFIG_DIR

    assert set(TASKS) >= {"passkey", "mqar", "copy", "flipflop"}
    for name in TASKS:
        assert (CONFIG_DIR / "task" / f"{name}.yaml").exists(), name


@pytest.mark.parametrize("name", sorted(TASKS))
@pytest.mark.parametrize("seq_len", [63, 64, 200])
def test_format_shapes_vocabulary_and_answers(name, seq_len):
    task = build_task(TASKS[name].config_class())
    x, y = task.sample(8, seq_len, gen())
    assert x.shape == y.shape == (8, seq_len) and x.dtype == y.dtype == torch.int64
    assert 0 <= int(x.min()) and int(x.max()) < task.vocab_size
    answers = y[y != -100]
    assert answers.numel() > 0 and int(answers.min()) >= 0 and int(answers.max()) < task.vocab_size
    if name != "mqar":  # MQAR's queries sit anywhere after the pairs; the others end on their answer
        assert (y[:, -1] != -100).all()
    tokens, answer = task.generate(8, seq_len + 1, gen())  # sample() is generate() shifted by one
    inputs = tokens[:, :-1] if task.answer_input is None else tokens[:, :-1].masked_fill(answer[:, :-1], 0)
    assert torch.equal(x, inputs) and torch.equal(y, tokens[:, 1:].masked_fill(~answer[:, 1:], -100))


@pytest.mark.parametrize("name", sorted(TASKS))
def test_deterministic_and_resumable_from_the_generator_state(name):
    task = build_task(TASKS[name].config_class())
    generator = gen(7)
    first = task.sample(4, 64, generator)
    state = generator.get_state()
    second = task.sample(4, 64, generator)
    again = task.sample(4, 64, gen(7))
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    resumed = torch.Generator()
    resumed.set_state(state)
    assert all(torch.equal(a, b) for a, b in zip(second, task.sample(4, 64, resumed)))
    assert not torch.equal(first[0], second[0])


def test_batch_stream_over_a_task_resumes_exactly():
    task = build_task(PasskeyConfig())
    stream = BatchStream(task, 4, 32, 0, DistInfo(), torch.device("cpu"))
    stream.next()
    state = stream.sampler_state
    expected = stream.next()
    resumed = BatchStream(task, 4, 32, 0, DistInfo(), torch.device("cpu"), state=state)
    assert all(torch.equal(a, b) for a, b in zip(expected[:2], resumed.next()[:2]))
    assert torch.equal(draw_batch(task, 4, 32, gen(3))[1], task.sample(4, 32, gen(3))[1])


def test_held_out_seeds_differ_from_the_training_seed_and_each_other():
    seeds = {held_out_seed(1337, purpose) for purpose in ("val", "eval:64:{}", "eval:128:{}")}
    assert len(seeds) == 3 and 1337 not in seeds
    assert held_out_seed(1337, "val") == held_out_seed(1337, "val") < 2**63


@pytest.mark.parametrize("fused", ["always", "never"])
def test_the_loss_covers_the_answer_tokens_only(fused):
    torch.manual_seed(0)
    task = build_task(MQARConfig(n_pairs=4, n_keys=8, n_values=8))
    x, y = task.sample(3, 32, gen())
    hidden = torch.randn(3, 32, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(task.vocab_size, 16, dtype=torch.float64, requires_grad=True)
    loss = lm_head_cross_entropy(hidden, weight, y, fused=fused)
    loss.backward()
    answers = y != -100
    logits = hidden.detach() @ weight.detach().t()
    expected = torch.nn.functional.cross_entropy(logits[answers], y[answers])
    assert torch.allclose(loss.detach(), expected)
    # no gradient reaches the hidden states of non-answer positions
    assert hidden.grad[~answers].abs().max() == 0 and hidden.grad[answers].abs().max() > 0
    with torch.no_grad():  # the validation path (no gradients)
        assert torch.allclose(lm_head_cross_entropy(hidden, weight, y), expected)


def test_task_group_sets_the_vocabulary_and_defaults():
    cfg = compose_config(["task=passkey", "task.key_len=3", "model.n_embd=64"])
    assert cfg.task.name == "passkey" and cfg.task.key_len == 3 and cfg.model.n_embd == 64
    assert cfg.train.seq_len == 64 and list(cfg.eval.length_multipliers) == [0.5, 0.75, 1, 2, 4, 8, 16]
    set_task_vocabulary(cfg)
    assert cfg.model.vocab_size == 17
    validate(cfg)
    plain = compose_config([])
    assert plain.task.name == "none" and plain.model.vocab_size == 50257
    set_task_vocabulary(plain)
    assert plain.model.vocab_size == 50257


@pytest.mark.parametrize(
    "override, message",
    [
        ("task.key_len=0", "task.key_len=0 is out of its domain [1, inf)"),
        ("train.seq_len=8", "needs train.seq_len >= 9"),
        ("eval.task_half_width=0", "eval.task_half_width"),
        ("eval.task_threshold=1.5", "eval.task_threshold"),
        ("eval.task_depths=[0.5,2.0]", "eval.task_depths"),
    ],
)
def test_bad_task_settings_are_refused(override, message):
    cfg = compose_config(["task=passkey", override])
    with pytest.raises(PosGPTError, match=re.escape(message)):
        validate(cfg)


def test_bad_task_choices_are_refused():
    with pytest.raises(PosGPTError, match="n_pairs"):
        validate(compose_config(["task=mqar", "task.n_pairs=40"]))
    with pytest.raises(PosGPTError, match="p_write"):
        validate(compose_config(["task=flipflop", "task.p_write=0.9", "task.p_read=0.2"]))
    with pytest.raises(PosGPTError, match="passkey"):
        compose_config(["task=passky"])
    with pytest.raises(PosGPTError):
        compose_config(["task=passkey", "task.n_pairs=3"])  # another task's key
    assert math.isfinite(OmegaConf.to_object(compose_config(["task=copy"]).task).n_tokens)
