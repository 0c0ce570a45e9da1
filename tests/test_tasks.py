"""Synthetic tasks (data/tasks/) and their evaluation (evaluation/task_accuracy.py), in-process: each generator's
format, determinism and resumability; the loss on answer tokens only; exact match, Wilson intervals and the
effective length on hand-made cases; an untrained model at chance; the config group."""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from core.errors import PosGPTError
from data import EOT_TOKEN, TokenArray, draw_batch
from data.config import DataConfig
from data.tasks import TASKS, build_task, held_out_seed
from data.tasks.aggregation import AggregationConfig
from data.tasks.copy import CopyConfig
from data.tasks.flipflop import BOS, READ, WRITE, ZERO, FlipFlopConfig
from data.tasks.mqar import MQARConfig
from data.tasks.needles import NeedlesConfig
from data.tasks.passkey import PasskeyConfig
from data.tasks.vartrack import VarTrackConfig
from evaluation import copy_probe
from evaluation.context import EvalContext
from evaluation.copy_probe import ProbeSettings, probe_windows, score_copies, span_candidates, with_first_copy
from evaluation.render import format_table, write_plots
from evaluation.task_accuracy import (
    TASK_ROWS,
    count_exact_matches,
    effective_lengths,
    evaluate_cell,
    examples_for,
    wilson_interval,
)
from experiment.compose import compose_config
from experiment.config import set_task_vocabulary, validate
from model import GPT
from model.gpt import ModelConfig
from model.loss import lm_head_cross_entropy
from model.pe.rope import RoPEConfig
from training.batch_stream import BatchStream
from training.distributed import DistInfo

CPU = torch.device("cpu")


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


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


def test_passkey_format_and_depth():
    cfg = PasskeyConfig(key_len=3, n_symbols=10, filler_len=4)
    task = build_task(cfg)
    key_marker, query_marker = 14, 15
    for depth, key_at in ((0.0, 0), (1.0, 40 - 2 * 3 - 2), (0.5, 16)):
        tokens, answer = task.generate(5, 40, gen(), depth=depth)
        assert (tokens[:, key_at] == key_marker).all(), depth
        key = tokens[:, key_at + 1 : key_at + 4]
        assert (tokens[:, -4] == query_marker).all() and torch.equal(tokens[:, -3:], key)
        assert int(answer.sum()) == 5 * 3 and answer[:, -3:].all()
        filler = torch.cat((tokens[:, :key_at], tokens[:, key_at + 4 : -4]), dim=1)
        # the filler "sentence" repeats: filler token j is n_symbols + j mod filler_len
        assert torch.equal(filler, (10 + torch.arange(filler.shape[1]) % 4).expand_as(filler))
    tokens, _ = task.generate(200, 40, gen())
    depths = (tokens == key_marker).int().argmax(dim=1)
    assert len(set(depths.tolist())) > 10  # random depth in training
    with pytest.raises(PosGPTError, match="depth"):
        task.sample(1, 39, gen(), depth=1.5)


def test_mqar_every_query_answers_its_value():
    task = build_task(MQARConfig(n_pairs=4, n_keys=8, n_values=8))
    tokens, answer = task.generate(16, 64, gen())
    for row, mask in zip(tokens, answer):
        pairs = dict(zip(row[0:8:2].tolist(), row[1:8:2].tolist()))
        assert len(pairs) == 4 and all(1 <= k <= 8 for k in pairs) and all(9 <= v <= 16 for v in pairs.values())
        answers = mask.nonzero().flatten().tolist()
        assert len(answers) == 4 and min(answers) > 8
        assert sorted(row[a - 1].item() for a in answers) == sorted(pairs)  # each key queried once
        assert all(pairs[row[a - 1].item()] == row[a].item() for a in answers)
        assert int((row[8:] != 0).sum()) == 8  # the rest is blank besides the queries


def test_mqar_draws_distinct_values_as_zoology_does():
    task = build_task(MQARConfig(n_pairs=8, n_keys=8, n_values=8))  # as many values as pairs: a permutation
    tokens, _ = task.generate(64, 64, gen())
    assert all(sorted(row[1:16:2].tolist()) == list(range(9, 17)) for row in tokens)
    with pytest.raises(PosGPTError, match="distinct values"):
        build_task(MQARConfig(n_pairs=8, n_keys=8, n_values=7))


def test_mqar_query_gaps_follow_zoologys_power_law():
    """Slot s (1 = just after the pairs) is drawn with probability proportional to a * s^(a - 1): with one pair,
    the first draw is exactly that distribution; power_a=1 is uniform."""
    n_slots, n = 30, 40_000
    for power_a in (0.01, 0.5, 1.0):
        task = build_task(MQARConfig(n_pairs=1, n_keys=2, n_values=2, power_a=power_a))
        _, answer = task.generate(n, 2 + 2 * n_slots, gen())
        slot = (answer.float().argmax(dim=1) - 3) // 2  # the answer sits at 2 + 2 * slot + 1
        observed = torch.bincount(slot, minlength=n_slots).double() / n
        s = torch.arange(1, n_slots + 1, dtype=torch.float64)
        expected = s ** (power_a - 1) / (s ** (power_a - 1)).sum()
        assert (observed - expected).abs().max() < 0.01, power_a


def test_mqar_answers_are_targets_only():
    """An answer's input position holds the blank (Zoology's inputs have filler there): the values answered so
    far must not tell later queries which values remain."""
    task = build_task(MQARConfig(n_pairs=4, n_keys=8, n_values=8))
    x, y = task.sample(16, 63, gen())
    tokens, answer = task.generate(16, 64, gen())  # the same stream: the same examples
    torch.testing.assert_close(y, tokens[:, 1:].masked_fill(~answer[:, 1:], -100))
    assert (x[answer[:, :-1]] == 0).all() and (x[~answer[:, :-1]] == tokens[:, :-1][~answer[:, :-1]]).all()
    assert (y[:, :8] == -100).all()  # nothing in the context pairs is scored


def test_mqar_trains_on_a_mixture_of_pair_counts_and_evaluates_at_n_pairs():
    task = build_task(MQARConfig(n_pairs=8, n_keys=16, n_values=16, min_pairs=2))
    generator = gen()
    drawn = [task.training_cell(generator)["n_pairs"] for _ in range(400)]
    assert set(drawn) == set(range(2, 9))
    tokens, answer = task.generate(4, 64, gen(), n_pairs=3)
    assert (answer.sum(dim=1) == 3).all() and (tokens[:, 6:] != 0).sum() == 4 * 6
    assert (task.sample(4, 63, gen())[1] != -100).sum() == 4 * 8  # evaluation: no cell, n_pairs
    generator = gen()  # training batches (train.py's stream) mix; validation batches are at n_pairs
    answered = {int((draw_batch(task, 4, 63, generator, training=True)[1] != -100).sum()) // 4 for _ in range(50)}
    assert answered == set(range(2, 9))
    assert {int((draw_batch(task, 4, 63, generator)[1] != -100).sum()) for _ in range(5)} == {4 * 8}
    still = gen()
    assert build_task(MQARConfig()).training_cell(still) == {}  # no mixture: nothing drawn
    assert torch.equal(still.get_state(), gen().get_state())
    with pytest.raises(PosGPTError, match="min_pairs"):
        build_task(MQARConfig(n_pairs=4, min_pairs=5))


def test_copy_repeats_the_scattered_tokens_in_order():
    task = build_task(CopyConfig(n_tokens=5, n_symbols=6))
    tokens, answer = task.generate(16, 50, gen())
    for row, mask in zip(tokens, answer):
        spread = 50 - 5 - 1
        assert row[spread] == 7 and mask[spread + 1 :].all() and not mask[: spread + 1].any()
        data = row[:spread][row[:spread] != 0]
        assert torch.equal(data, row[spread + 1 :])


def test_flipflop_reads_return_the_last_write():
    task = build_task(FlipFlopConfig(p_write=0.2, p_read=0.3))
    for length in (40, 41):
        tokens, answer = task.generate(32, length, gen())
        for row, mask in zip(tokens, answer):
            offset = length % 2
            assert offset == 0 or row[0] == BOS
            ops, bits = row[offset::2], row[offset + 1 :: 2] - ZERO
            assert ops[0] == WRITE and ops[-1] == READ and set(bits.tolist()) <= {0, 1}
            last = None
            for op, bit in zip(ops.tolist(), bits.tolist()):
                if op == WRITE:
                    last = bit
                elif op == READ:
                    assert bit == last
            assert torch.equal(mask[offset + 1 :: 2], ops == READ) and not mask[offset::2].any()


def test_needles_answer_the_queried_keys_values_among_distractors():
    cfg = NeedlesConfig(n_keys=3, n_values=2, n_symbols=6, n_key_symbols=5, filler_len=3)
    task = build_task(cfg)
    key_marker, query_marker = 6 + 5 + 3, 6 + 5 + 3 + 1
    for length in (cfg.n_keys * 4 + 4, 47):
        tokens, answer = task.generate(32, length, gen())
        for row, mask in zip(tokens.tolist(), answer.tolist()):
            assert row[-4] == query_marker and mask == [False] * (length - 2) + [True, True]
            needles = {row[i + 1]: row[i + 2 : i + 4] for i in range(length - 4) if row[i] == key_marker}
            assert len(needles) == 3 and all(6 <= key < 11 for key in needles)  # distinct keys, all intact
            assert row[-2:] == needles[row[-3]]  # the queried key's values
            fill = [t for i, t in enumerate(row[:-4]) if not any(s <= i < s + 4 for s in _starts(row, key_marker))]
            assert set(fill) <= {11, 12, 13}


def test_needles_train_on_a_mixture_of_needle_counts_and_evaluate_at_n_keys():
    task = build_task(NeedlesConfig(n_keys=4, min_keys=1))
    key_marker = 10 + 16 + 5
    generator = gen()
    assert {task.training_cell(generator)["n_keys"] for _ in range(300)} == {1, 2, 3, 4}
    tokens, _ = task.generate(8, 40, gen(), n_keys=1)
    assert ((tokens == key_marker).sum(dim=1) == 1).all() and task.min_length(n_keys=1) == 8
    assert ((task.sample(8, 40, gen())[0] == key_marker).sum(dim=1) == 4).all()  # evaluation: n_keys
    counts = {
        frozenset((task.training_batch(16, 40, generator)[0] == key_marker).sum(dim=1).tolist()) for _ in range(40)
    }
    assert all(len(count) == 1 for count in counts) and len(counts) == 4  # one count a batch, every count drawn
    still = gen()
    assert build_task(NeedlesConfig()).training_cell(still) == {}  # no mixture: nothing drawn
    assert torch.equal(still.get_state(), gen().get_state())
    with pytest.raises(PosGPTError, match="min_keys=5 is more than task.n_keys=4"):
        build_task(NeedlesConfig(n_keys=4, min_keys=5))


def test_needles_query_several_distinct_needles_in_turn():
    """RULER's multi-query needle: n_queries distinct needles queried at the end, each followed by its values,
    every value an answer token; a batch with fewer needles than queries queries each once."""
    cfg = NeedlesConfig(n_keys=4, n_values=2, n_symbols=6, n_key_symbols=5, filler_len=3, n_queries=3, min_keys=1)
    task = build_task(cfg)
    key_marker, query_marker = 6 + 5 + 3, 6 + 5 + 3 + 1
    assert task.min_length() == (4 + 3) * 4 and task.min_length(n_keys=2) == (2 + 2) * 4
    for n_keys, length in ((4, 28), (4, 61), (2, 30)):
        n_queries = min(3, n_keys)
        tokens, answer = task.generate(32, length, gen(), n_keys=n_keys)
        for row, mask in zip(tokens.tolist(), answer.tolist()):
            context = length - 4 * n_queries
            needles = {row[i + 1]: row[i + 2 : i + 4] for i in range(context) if row[i] == key_marker}
            assert len(needles) == n_keys
            tail = [row[i : i + 4] for i in range(context, length, 4)]
            assert [q[0] for q in tail] == [query_marker] * n_queries
            assert len({q[1] for q in tail}) == n_queries  # distinct needles
            assert all(q[2:] == needles[q[1]] for q in tail)  # each queried key's values
            assert mask == [False] * context + [False, False, True, True] * n_queries
    with pytest.raises(PosGPTError, match="n_queries=5 distinct needles to query need task.n_keys >= n_queries"):
        build_task(NeedlesConfig(n_keys=4, n_queries=5))


def test_needles_can_hide_answers_from_the_inputs():
    """task.hide_answers: the same instances, each answer's input position the blank (the new last token id), so
    that no query is answered from the values already given; the targets are the answers as before."""
    settings = {"n_keys": 4, "n_queries": 4, "min_keys": 1}
    shown, hidden = build_task(NeedlesConfig(**settings)), build_task(NeedlesConfig(**settings, hide_answers=True))
    assert hidden.vocab_size == shown.vocab_size + 1 and shown.answer_input is None
    (x, y), (hx, hy) = (task.training_batch(16, 63, gen()) for task in (shown, hidden))
    assert torch.equal(hy, y)
    answers = torch.zeros_like(y, dtype=torch.bool)
    answers[:, 1:] = y[:, :-1] != -100  # the input after an answer target is that answer
    assert answers.sum() > 0 and torch.equal(hx[answers], torch.full_like(hx[answers], hidden.vocab_size - 1))
    assert torch.equal(hx[~answers], x[~answers]) and not (x == hidden.vocab_size - 1).any()


PINNED_NEEDLES = [
    [31, 22, 1, 2, 31, 12, 1, 0, 29, 30, 26, 31, 13, 2, 9, 26, 31, 23, 7, 7, 32, 23, 7, 7],
    [26, 31, 21, 5, 2, 31, 12, 5, 0, 31, 22, 1, 2, 29, 30, 31, 13, 8, 7, 30, 32, 12, 5, 0],
]


def test_one_needle_query_draws_what_it_drew_before_n_queries():
    """Pinned instances of the default needles (one query): runs made before task.n_queries existed stay
    reproducible. The numbers are the default generator's draws at seed 0, recorded when n_queries was added."""
    tokens, answer = build_task(NeedlesConfig()).generate(2, 24, gen())
    assert tokens.tolist() == PINNED_NEEDLES and answer[:, -2:].all() and answer.sum() == 4


def _starts(row: list[int], marker: int) -> list[int]:
    return [i for i, token in enumerate(row) if token == marker]


def test_vartrack_lists_every_variable_that_holds_the_queried_value():
    cfg = VarTrackConfig(n_chains=3, n_hops=2, n_symbols=5, n_var_symbols=12, filler_len=2)
    task = build_task(cfg)
    let, query = 5 + 12 + 2, 5 + 12 + 2 + 1
    for length in (task.min_length(), 80):
        tokens, answer = task.generate(32, length, gen(1))
        for row, mask in zip(tokens.tolist(), answer.tolist()):
            assert row[-5] == query and sum(mask) == 3 and all(mask[-3:])
            statements = [(row[i + 1], row[i + 2]) for i in _starts(row[:-5], let)]
            assert len(statements) == 9 and len({target for target, _ in statements}) == 9
            holds, value = [], row[-4]  # follow the assignments in order: who holds the value
            for target, source in statements:
                if source == value or source in holds:
                    holds.append(target)
            assert row[-3:] == holds


def test_aggregation_answers_the_symbols_twice_as_frequent_in_ascending_order():
    task = build_task(AggregationConfig(n_symbols=6, n_frequent=2))
    for length in (task.min_length(), 100):
        tokens, answer = task.generate(16, length, gen(2))
        a = (length - 3) // (2 * 2 + 4)
        for row, mask in zip(tokens.tolist(), answer.tolist()):
            counts = Counter(row[:-3])
            frequent = sorted(symbol for symbol in range(6) if counts[symbol] == 2 * a)
            assert len(frequent) == 2 and all(counts[s] == a for s in range(6) if s not in frequent)
            assert row[-3] == 7 and row[-2:] == frequent and mask == [False] * (length - 2) + [True, True]
    with pytest.raises(PosGPTError, match="n_frequent"):
        build_task(AggregationConfig(n_symbols=3, n_frequent=3))


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


def test_wilson_interval_and_examples():
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-4) and high == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(0, 385)[0] == 0.0 and wilson_interval(385, 385)[1] == 1.0
    assert examples_for(0.05) == 385 and examples_for(0.1) == 97
    for h in (0.05, 0.02):  # n is enough for a half-width of at most h at any accuracy
        n = examples_for(h)
        assert max((wilson_interval(k, n)[1] - wilson_interval(k, n)[0]) / 2 for k in range(n + 1)) <= h


class Oracle(torch.nn.Module):
    """Logits that put the true next token first, except on the rows in ``wrong`` (one answer missed)."""

    def __init__(self, y: torch.Tensor, wrong: set[int], vocab: int) -> None:
        super().__init__()
        self.y, self.wrong, self.vocab, self.row = y, wrong, vocab, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.y[self.row : self.row + len(x)].clamp(min=0)
        logits = torch.nn.functional.one_hot(y, self.vocab).float()
        for i in range(len(x)):
            if self.row + i in self.wrong:  # the last answer token wrong
                logits[i, -1] = torch.nn.functional.one_hot((y[i, -1] + 1) % self.vocab, self.vocab).float()
        self.row += len(x)
        return logits


def test_exact_match_needs_every_answer_token():
    task = build_task(PasskeyConfig())
    x, y = task.sample(10, 40, gen())
    model = Oracle(y, wrong={2, 5, 9}, vocab=task.vocab_size)
    # batch_tokens=120: three rows per forward pass, four passes
    matches = count_exact_matches(model, x, y, 120, torch.device("cpu"), torch.float32)
    assert matches.correct == 7
    key_len = PasskeyConfig().key_len  # every example has key_len answer tokens; three had their last one wrong
    assert matches.answer_n == [10] * key_len and matches.answer_correct == [10] * (key_len - 1) + [7]


def test_each_answer_token_is_counted_in_its_place_among_its_examples_answers():
    """Answers of different counts per example (flip-flop's reads): the k-th answer token of every example that
    has k, whichever position it is at, in any batching."""
    y = torch.full((3, 8), -100)
    y[0, [1, 5]] = 1  # two answers
    y[1, [2, 3, 7]] = 1  # three
    y[2, [6]] = 1  # one
    model = Oracle(y, wrong={1}, vocab=4)  # example 1's last answer wrong
    for batch_tokens in (8, 24):
        model.row = 0
        matches = count_exact_matches(model, torch.zeros_like(y), y, batch_tokens, torch.device("cpu"), torch.float32)
        assert (matches.correct, matches.answer_correct, matches.answer_n) == (2, [3, 2, 0], [3, 2, 1])


def test_effective_length_is_where_accuracy_first_falls_below_the_threshold():
    def row(length, accuracy, variation="", depth=None):
        return {"task": "passkey", "length": length, "depth": depth, "accuracy": accuracy, "variation": variation}

    rows = [row(64, 1.0), row(128, 0.95), row(256, 0.5), row(512, 0.95), row(64, 0.2, depth=0.5)]
    rows += [row(64, 0.8, "yarn:8"), row(128, 1.0, "yarn:8")]
    rows += [row(64, 0.99, "ntk:8"), row(128, None, "ntk:8")]
    found = effective_lengths(rows, 0.9)
    assert found == {"": 128, "yarn:8": None, "ntk:8": 64}


def test_an_untrained_model_scores_at_chance():
    torch.manual_seed(0)
    for cfg in (PasskeyConfig(), MQARConfig()):
        task = build_task(cfg)
        model = GPT(ModelConfig(n_embd=32, vocab_size=task.vocab_size), RoPEConfig(), train_seq_len=64).eval()
        row = evaluate_cell(model, task, 64, {}, 200, 0, 4096, torch.device("cpu"), torch.float32)
        assert row["n"] == 200 and row["accuracy"] <= 0.02, (cfg.name, row)  # chance: 1e-4, 32^-8
        assert row["ci_low"] == 0.0 or row["ci_low"] < row["accuracy"] < row["ci_high"]


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


def shard(tmp_path, n: int) -> TokenArray:
    path = tmp_path / "tokens.bin"
    np.arange(n, dtype=np.uint16).tofile(path)
    return TokenArray([path], name="val")


def test_copy_probe_writes_the_span_twice_into_held_out_text(tmp_path):
    tokens = shard(tmp_path, 1000)
    control = probe_windows(tokens, 6, 64, 8, span_candidates(50257), gen())
    windows = with_first_copy(control, 40, 8)
    assert windows.shape == control.shape == (6, 64)
    assert torch.equal(windows[:, 56:], windows[:, 16:24])  # first copy at 64 - 8 - 40
    text = torch.cat((windows[:, :16], windows[:, 24:56]), dim=1)
    assert ((text[:, 1:] - text[:, :-1]) == 1).sum() >= 6 * 30  # the rest is the (consecutive) text
    assert not (windows[:, 56:] == EOT_TOKEN).any()
    # the control: the same windows and span, the text left where the first copy was
    assert torch.equal(control[:, 56:], windows[:, 56:]) and torch.equal(control[:, :16], windows[:, :16])
    assert torch.equal(control[:, 16:24], control[:, 15:23] + 1)  # consecutive text, no copy
    # another distance writes into the same windows, and leaves the control as drawn
    farther = with_first_copy(control, 48, 8)
    assert torch.equal(farther[:, 8:16], control[:, 56:]) and torch.equal(farther[:, 16:], control[:, 16:])
    assert torch.equal(control[:, 16:24], control[:, 15:23] + 1)


def test_the_whole_vocabulary_draw_is_the_one_results_were_made_with(tmp_path):
    """eval.copy_min_count=0 draws the span as the probe did before candidates existed (uniform over 0..50255,
    shifted past <|endoftext|>)."""
    tokens = shard(tmp_path, 1000)
    windows = probe_windows(tokens, 50, 64, 8, span_candidates(50257), gen(3))
    generator = gen(3)
    torch.randint(0, 1000 - 64 + 1, (50,), generator=generator)  # the window starts
    draws = torch.randint(0, 50257 - 1, (50, 8), generator=generator)
    assert torch.equal(windows[:, 56:], draws + (draws >= EOT_TOKEN).long())


def test_span_candidates_are_the_tokens_seen_often_enough(tmp_path):
    path = tmp_path / "train.bin"
    np.array([5, 5, 5, 7, 7, 9, EOT_TOKEN, EOT_TOKEN, EOT_TOKEN, 299], dtype=np.uint16).tofile(path)
    train = TokenArray([path], name="train")
    assert span_candidates(300, 1, train).tolist() == [5, 7, 9, 299]  # never <|endoftext|> (out of range here)
    assert span_candidates(50257, 2, train).tolist() == [5, 7]  # <|endoftext|> is never a candidate
    assert span_candidates(300, 4, train).tolist() == []
    assert len(span_candidates(300)) == 300 and len(span_candidates(50257)) == 50256
    windows = probe_windows(shard(tmp_path, 100), 40, 32, 6, span_candidates(300, 2, train), gen())
    assert set(windows[:, 26:].unique().tolist()) == {5, 7}


def test_probe_candidates_count_the_training_split_once_a_process(tmp_path, monkeypatch):
    """Training checks eval.copy_min_count before its first step and scores the probe after its last: one count."""
    path = tmp_path / "train.bin"
    np.array([5, 5, 7, 7, 9], dtype=np.uint16).tofile(path)
    loads = []
    monkeypatch.setattr(copy_probe, "_COUNTED_CANDIDATES", {})
    monkeypatch.setattr(
        copy_probe, "load_split", lambda data, split, progress: loads.append(data.name) or TokenArray([path])
    )

    def candidates(name: str, min_count: int) -> list[int]:
        return copy_probe.probe_candidates(DataConfig(name=name), min_count, 300).tolist()

    assert candidates("a", 2) == [5, 7]
    assert candidates("a", 2) == [5, 7] and loads == ["a"]
    assert candidates("b", 1) == [5, 7, 9] and loads == ["a", "b"]
    for _ in range(2):  # a refusal is as reliable the second time
        with pytest.raises(PosGPTError, match="eval.copy_min_count=3 leaves 0 token"):
            candidates("a", 3)


class ContextBlind(torch.nn.Module):
    """A bigram model: its prediction at a position depends on that position's token alone."""

    vocab_size = 300

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(300, 300)
        self.head_weight = torch.eye(300)

    def hidden_states(self, idx: torch.Tensor) -> torch.Tensor:
        return self.embedding(idx)


class Copier(ContextBlind):
    """An induction head written out: at each position, the token that followed the latest earlier occurrence of
    this position's token (nothing where there is none)."""

    def hidden_states(self, idx: torch.Tensor) -> torch.Tensor:
        hidden = torch.zeros(*idx.shape, 300)
        for b, row in enumerate(idx.tolist()):
            for t, token in enumerate(row):
                earlier = [s for s in range(t) if row[s] == token]
                if earlier:
                    hidden[b, t, row[earlier[-1] + 1]] = 20.0
        return hidden


def probe_and_control(model, tokens: TokenArray) -> list[tuple[int, int, float]]:
    control = probe_windows(tokens, 7, 32, 6, span_candidates(300), gen())
    return [
        score_copies(model, windows, 6, 64, CPU, torch.float32)
        for windows in (with_first_copy(control, 10, 6), control)
    ]


def test_the_first_copy_helps_a_copier_and_not_a_model_blind_to_context(tmp_path):
    """copy_gain (the probe's log-probability minus its control's, the same span without the first copy) is
    exactly 0 for a model that cannot look back, and near ln 300 for one that copies."""
    torch.manual_seed(0)
    tokens = shard(tmp_path, 300)
    blind = probe_and_control(ContextBlind().eval(), tokens)
    assert blind[0] == blind[1]  # same span, same predictions: the first copy changes nothing
    (exact, right, logprob), (control_exact, _, control) = probe_and_control(Copier(), tokens)
    assert exact >= 6 and right >= 33 and control_exact == 0  # 7 examples x 5 targets; a span may repeat a token
    assert (logprob - control) / 35 > 0.8 * math.log(300)


def test_copy_probe_scores_match_the_full_logits(tmp_path):
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_embd=16, n_layer=1, n_head=2, vocab_size=300), RoPEConfig(), train_seq_len=32).eval()
    windows = with_first_copy(probe_windows(shard(tmp_path, 300), 5, 32, 6, span_candidates(300), gen()), 10, 6)
    exact, right, logprob = score_copies(model, windows, 6, 64, torch.device("cpu"), torch.float32)
    with torch.no_grad():
        logits = model(windows)[:, 26:31]
    targets = windows[:, 27:32]
    hits = logits.argmax(-1) == targets
    assert (exact, right) == (int(hits.all(1).sum()), int(hits.sum()))
    expected = logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).sum()
    assert logprob == pytest.approx(float(expected), rel=1e-5)


def probe_context(model: torch.nn.Module, run_dir: Path) -> EvalContext:
    """The context the copy probe scores ``model`` in: lengths 16 and 32, training seed 1."""
    return EvalContext(model, run_dir, CPU, torch.float32, {}, 0, [16, 32], "rope", 32, 1, data=DataConfig())


def test_the_distances_of_a_length_share_their_windows_and_control(tmp_path):
    """probe_length draws one set of windows and spans a length: each distance's row scores its first copy
    written into them, against one control."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_embd=16, n_layer=1, n_head=2, vocab_size=300), RoPEConfig(), train_seq_len=32).eval()
    settings = ProbeSettings(copy_span=6, copy_min_count=0, task_half_width=0.3, task_threshold=0.9, batch_tokens=64)
    tokens, candidates = shard(tmp_path, 300), span_candidates(300)
    context = probe_context(model, tmp_path)
    rows = copy_probe.probe_length(context, settings, tokens, candidates, {"length": 32}, [10, 26])
    assert [row["distance"] for row in rows] == [10, 26] and len({row["seed"] for row in rows}) == 1
    control = probe_windows(tokens, 11, 32, 6, candidates, torch.Generator().manual_seed(rows[0]["seed"]))
    *_, control_logprob = score_copies(model, control, 6, 64, CPU, torch.float32)
    for row in rows:
        exact, _, logprob = score_copies(model, with_first_copy(control, row["distance"], 6), 6, 64, CPU, torch.float32)
        assert row["n"] == 11 and row["correct"] == exact
        assert row["mean_logprob"] == pytest.approx(logprob / 55) and row["control_logprob"] == control_logprob / 55
    assert rows[0]["mean_logprob"] != rows[1]["mean_logprob"]  # the first copies differ
    other = copy_probe.probe_length(context, settings, tokens, candidates, {"length": 16}, [10])
    assert other[0]["seed"] != rows[0]["seed"]  # another length, another draw


def test_probes_are_for_language_model_runs():
    with pytest.raises(PosGPTError, match="eval.tasks may hold"):
        validate(compose_config(["eval.tasks=[passkey]"]))
    with pytest.raises(PosGPTError, match="eval.tasks may hold"):  # not "eval.copy_span is read only when ..."
        validate(compose_config(["eval.tasks=[copy]", "eval.copy_span=8"]))
    with pytest.raises(PosGPTError, match="language-model run"):
        validate(compose_config(["task=passkey", "eval.tasks=[copy_probe]"]))
    validate(compose_config(["eval.tasks=[copy_probe]"]))


def probe_row(length: int, distance: int, min_count: int, gain: float) -> dict:
    return dict(
        task="copy_probe",
        length=length,
        distance=distance,
        copy_span=16,
        copy_min_count=min_count,
        data="python_stdlib",
        corpus="c",
        split="val",
        accuracy=0.0,
        ci_low=0.0,
        ci_high=0.1,
        n=97,
        copy_gain=gain,
    )


def test_probes_of_two_settings_are_shown_apart(tmp_path):
    """Rows of eval.copy_min_count 0 and 1000 in one tasks.json: a table row each, a heatmap each, none pooled."""
    rows = [probe_row(64, 48, 0, 0.161), probe_row(64, 48, 1000, 0.034), probe_row(128, 48, 1000, -0.011)]
    document = {"task": "copy_probe", "pe": "rope", "train_seq_len": 64, "step": 500, "results": rows}
    document.update(threshold=0.9, effective_length={})
    text = format_table(document, TASK_ROWS)
    assert "distance 48 copy_min_count=0 " in text and "distance 48 copy_min_count=1000 " in text
    accuracy, gain = text.split("copy_gain (nats the first copy adds)")
    assert gain.count("+0.161") == 1 and "+0.034" in gain and "-0.011" in gain
    (tmp_path / "distance_length.png").write_bytes(b"stale")  # drawn when the run had one probe setting
    plots = write_plots(document, tmp_path, TASK_ROWS, {})
    names = sorted(path.name for path in tmp_path.glob("distance_length*.png"))
    assert names == ["distance_length_copy_min_count=0.png", "distance_length_copy_min_count=1000.png"]
    assert sorted(plots) == ["distance_length_copy_min_count=0", "distance_length_copy_min_count=1000"]
    # probes of other text: the file name holds no path separator
    other = {**document, "results": [rows[0], {**rows[1], "copy_min_count": 0, "corpus": "files /data/book one.txt"}]}
    assert "distance_length_corpus=files_data_book_one.txt" in write_plots(other, tmp_path, TASK_ROWS, {})
    # one setting alone: no suffix, as before
    assert "copy_min_count" not in format_table({**document, "results": rows[:1]}, TASK_ROWS)
