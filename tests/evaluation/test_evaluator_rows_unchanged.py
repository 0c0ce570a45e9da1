"""What the evaluation scores has not changed since the evaluators became plug-ins: the default evaluation of a small
text run (perplexity in three protocols, key tokens, the copy probe, a variation) and of a task run gives the rows
that posgpt gave before the change (commit a444327), to float32's rounding.

tests/support/reference/eval_rows_a444327.json holds those rows, made by this module's own procedure run against that
commit's tree (``python tests/evaluation/test_evaluator_rows_unchanged.py <tree> <out.json>``). The corpus is generated
here from a fixed seed, so it is the same on every machine and Python."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from repo_root import REPO, SUPPORT

REFERENCE = SUPPORT / "reference" / "eval_rows_a444327.json"
# The fields that say which measurement a row is, and the numbers it measured (not its timing or memory).
KEYS = ("evaluator_file", "task", "length", "protocol", "stride", "sinks", "variation", "measure", "depth", "distance")
NUMBERS = ("loss", "ppl", "tokens", "key_share", "key_candidates", "accuracy", "correct", "n", "mean_logprob")
NUMBERS += ("control_logprob", "copy_gain", "token_accuracy", "ci_low", "ci_high")
RUNS = {
    "text": (
        ["pe=rope"],
        [
            "eval.protocols=[nonoverlapping,sliding,streaming]",
            "eval.streaming_sinks=2",
            "eval.max_tokens=512",
            "eval.lengths=[16,32,64]",
            "eval.key_tokens=true",
            "eval.key_lsd_threshold=0",
            "eval.key_lcl_threshold=-100",
            "eval.tasks=[copy_probe]",
            "eval.copy_span=4",
            "eval.task_half_width=0.2",
            "eval.variations=[none,yarn:2]",
        ],
    ),
    "task": (
        ["pe=rope", "task=passkey"],
        ["eval.task_half_width=0.2", "eval.variations=[none,ntk:2]", "eval.lengths=[16,32]"],
    ),
}


def corpus(path: Path) -> Path:
    """~40k characters of words drawn from a fixed seed: the same text everywhere."""
    words = ["alpha", "beta", "gamma", "delta", "def", "return", "class", "value", "(", ")", ":", "\n", "    "]
    draw = random.Random(1234)
    path.write_text(" ".join(draw.choice(words) for _ in range(8000)))
    return path


def in_a_process(tree: Path, work: Path) -> Callable[[list[str]], subprocess.CompletedProcess]:
    """``python eval.py <argv>`` of ``tree`` as a process of its own (how the reference was made)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "POSGPT_CACHE_DIR": str(work / "cache")}
    return lambda argv: subprocess.run(
        [sys.executable, "eval.py", *argv], cwd=tree, env=env, capture_output=True, text=True
    )


def scored_rows(tree: Path, work: Path, evaluate: Callable | None = None) -> dict[str, list[dict]]:
    """Each run's rows (KEYS and NUMBERS of every results file), evaluated by ``tree``'s eval.py (``evaluate``:
    argv -> its completed process; a process of its own by default) on a checkpoint made by its
    tests/support/tiny_checkpoint.py."""
    sys.path[:0] = [str(tree), str(tree / "tests" / "support"), str(tree / "tests")]  # tests/ in older trees
    from tiny_checkpoint import make_run

    evaluate = evaluate or in_a_process(tree, work)
    text = corpus(work / "corpus.txt")
    found = {}
    for name, (trained, evaluated) in RUNS.items():
        run_dir = make_run(work / name, text, *trained, seed=1)
        done = evaluate([f"run_dir={run_dir}", *evaluated])
        assert done.returncode == 0, done.stderr
        rows = []
        for file in ("extrapolation.json", "tasks.json"):
            path = run_dir / "eval" / file
            if path.exists():
                for row in json.loads(path.read_text())["results"]:
                    rows.append({key: row.get(key) for key in (*KEYS, *NUMBERS)} | {"evaluator_file": file})
        found[name] = sorted(rows, key=lambda row: json.dumps([row[key] for key in KEYS]))
    return found


@pytest.mark.slow
def test_the_rows_are_those_from_before_the_plugins(cli, tmp_path):
    expected = json.loads(REFERENCE.read_text())
    found = scored_rows(REPO, tmp_path, lambda argv: cli.here("eval.py", *argv))
    for name in RUNS:
        assert [[row[key] for key in KEYS] for row in found[name]] == [
            [row[key] for key in KEYS] for row in expected[name]
        ]
        for new, old in zip(found[name], expected[name]):
            for key in NUMBERS:
                if isinstance(old[key], float):
                    assert new[key] == pytest.approx(old[key], rel=1e-5, abs=1e-9), (name, key, new)
                else:
                    assert new[key] == old[key], (name, key, new)


if __name__ == "__main__":
    tree, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        out.write_text(json.dumps(scored_rows(tree, Path(work)), indent=1) + "\n")
