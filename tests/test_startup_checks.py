"""Values that each key's own domain accepts but that break the arithmetic together with another key or with the
data: each is refused at start-up, in one line naming both keys, exit code 2, before anything is written; and
each command's boundary values inside the domain compute a result. Every case runs through the real command
line (in this process, as ``python <script> <argv>`` runs it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runs import assert_one_line_error


def refused_before_writing(done, run_dir: Path, *fragments: str) -> None:
    assert_one_line_error(done, *fragments)
    assert not run_dir.exists(), sorted(p.name for p in run_dir.iterdir())


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        # the default corpus's ids reach 50256: an IndexError at the first step, or, on a corpus whose ids happen
        # to be smaller, a perplexity over a vocabulary that cannot represent the tokenizer's output
        (["model.vocab_size=1000"], ["model.vocab_size=1000", "data.name=text", "50257"]),
        (["model.vocab_size=1"], ["model.vocab_size=1", "at least 50257"]),
        # a task sets the vocabulary itself: a value given for the run would be ignored
        (["task=passkey", "model.vocab_size=1000"], ["model.vocab_size=1000", "task=passkey"]),
    ],
)
def test_a_vocabulary_smaller_than_the_datas_is_refused(cli, tmp_path, extra, fragments):
    run_dir = tmp_path / "run"
    refused_before_writing(cli.train_here(run_dir, *extra), run_dir, *fragments)
