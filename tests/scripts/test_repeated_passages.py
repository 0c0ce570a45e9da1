"""scripts/repeated_passages.py: the induction control's corpus (every passage written twice) and its measure,
the loss on a passage's first occurrence against its repeat (results/induction-control/halves.jsonl)."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import repeated_passages
import torch
from tiny_checkpoint import make_run

WORDS = " ".join(f"w{i}" for i in range(400))  # 400 distinct words: a passage's place in its file is visible


@pytest.fixture
def stdlib(tmp_path: Path) -> Path:
    """A standard library of two files, and one too short to draw from."""
    (tmp_path / "lib" / "pkg").mkdir(parents=True)
    (tmp_path / "lib" / "a.py").write_text(WORDS)
    (tmp_path / "lib" / "pkg" / "b.py").write_text(WORDS.replace("w", "v"))
    (tmp_path / "lib" / "short.py").write_text("too few words")
    return tmp_path / "lib"


def test_passages_are_runs_of_8_to_40_consecutive_words_drawn_alike_for_a_seed(stdlib):
    draw = repeated_passages.passages(0, stdlib)
    drawn = [next(draw) for _ in range(200)]
    for passage in drawn:
        words = passage.split()
        numbers = [int(word[1:]) for word in words]
        assert 8 <= len(words) <= 40 and len({word[0] for word in words}) == 1  # from one file
        assert numbers == list(range(numbers[0], numbers[0] + len(words)))  # consecutive words
    again = repeated_passages.passages(0, stdlib)
    assert [next(again) for _ in range(200)] == drawn
    other = repeated_passages.passages(1, stdlib)
    assert [next(other) for _ in range(200)] != drawn


def test_the_corpus_writes_each_passage_twice(stdlib, tmp_path):
    path = repeated_passages.write_corpus(tmp_path / "repeated.jsonl", rows=5, stdlib=stdlib)
    texts = [json.loads(line)["text"] for line in path.read_text().splitlines()]
    draw = repeated_passages.passages(repeated_passages.CORPUS_SEED, stdlib)
    assert texts == [f"{passage} {passage}" for passage in (next(draw) for _ in range(5))]


def test_held_out_passages_fit_the_training_length_with_their_repeat(stdlib):
    pairs = repeated_passages.held_out_pairs(20, stdlib)
    assert len(pairs) == 20
    assert all(len(first) + len(repeat) <= repeated_passages.WINDOW and len(repeat) >= 4 for first, repeat in pairs)


def test_halves_scores_each_half_on_its_own_targets():
    """A model that gives every token the same probability: both halves at ln V, no difference."""
    vocab = 50
    run = SimpleNamespace(device="cpu", model=lambda ids: torch.zeros(*ids.shape, vocab))
    scores = repeated_passages.halves(run, [([1, 2, 3, 4, 5], [6, 2, 3, 4, 5]), ([7, 8], [9, 8, 9, 8])])
    assert scores == {
        "first_occurrence_loss": round(math.log(vocab), 4),
        "repeat_loss": round(math.log(vocab), 4),
        "difference": 0.0,
    }


@pytest.mark.slow  # runs a command on a trained run
def test_halves_prints_a_line_per_run(cli, tmp_path, capsys):
    run_dir = make_run(tmp_path / "probe" / "step_00000300", cli.corpus, "pe=rope", "model.embedding=gpt2")
    repeated_passages.main(["halves", str(run_dir)])
    record = json.loads(capsys.readouterr().out)
    assert record["run"] == "probe/step_00000300" and record["step"] == 0 and record["embedding"] == "gpt2"
    assert record["passages"] == repeated_passages.PASSAGES
    assert record["difference"] == pytest.approx(record["first_occurrence_loss"] - record["repeat_loss"], abs=2e-4)
