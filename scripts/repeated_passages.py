"""The induction control's corpus, text in which every passage repeats, and its in-distribution copying measure
(results/induction-control/).

    python scripts/repeated_passages.py corpus runs/induction-control/repeated.jsonl   # 50,000 rows, ~22 MB
    python scripts/repeated_passages.py halves runs/induction-control/probe-*/step_*/ > halves.jsonl

``corpus``: each row of the .jsonl is a passage of n consecutive whitespace-separated words of one file of this
Python's standard library (n uniform in 8..40, about 10-70 GPT-2 tokens; seed 0), written twice: a model that
copies from its context predicts the repeat. The corpus depends on the Python version (its standard library).

``halves``: the loss on a passage's first occurrence and on its repeat (the targets after the repeat's first
token), over 300 passages drawn as the corpus is but with another seed, each with both occurrences within 64
tokens (the training length). One JSON line per run directory given (each scored at its checkpoints/last.pt); a
model that copies scores the repeat far below the first occurrence. Every run is loaded and checked (a text run with
a checkpoint) before the first is scored; ``corpus``'s output is checked (not another run's files, writable) before
it is written.
"""

from __future__ import annotations

import _repo

import argparse
import json
import random
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import torch

from core.cli import ArgumentParser, count, exit_on_user_error
from core.files import check_outputs, check_writable
from data.tokenizer import gpt2_encoding
from experiment.build import TrainedRun, load_trained_run, require_text_run

CORPUS_ROWS = 50_000
CORPUS_SEED = 0
HELD_OUT_SEED = 12345  # not the corpus's: the scored passages are drawn apart from the training text
PASSAGES = 300
WINDOW = 64  # both occurrences within the default training length


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    corpus = commands.add_parser("corpus", help="write the corpus (.jsonl, one passage written twice a row)")
    corpus.add_argument("out", type=Path)
    corpus.add_argument("--rows", type=count(1), default=CORPUS_ROWS, help=f"rows to write (default {CORPUS_ROWS:,})")
    halves = commands.add_parser("halves", help="score runs: first occurrence vs repeat, a JSON line each")
    halves.add_argument("run_dirs", nargs="+", type=Path, help="run directories (each scored at its last.pt)")
    return parser.parse_args(argv)


def passages(seed: int, stdlib: Path | None = None) -> Iterator[str]:
    """Passages of 8-40 consecutive words of the standard library's files (``stdlib``: its folder, this Python's
    by default), drawn without end."""
    rng = random.Random(seed)
    stdlib = Path(sysconfig.get_paths()["stdlib"]) if stdlib is None else stdlib
    files = sorted(path for path in stdlib.rglob("*.py") if "site-packages" not in path.parts)
    texts = [text for text in (path.read_text(errors="ignore").split() for path in files) if len(text) > 50]
    while True:
        words = rng.choice(texts)
        n = rng.randint(8, 40)
        start = rng.randrange(len(words) - n)
        yield " ".join(words[start : start + n])


def write_corpus(path: Path, rows: int = CORPUS_ROWS, stdlib: Path | None = None) -> Path:
    with open(path, "w") as out:
        for _, passage in zip(range(rows), passages(CORPUS_SEED, stdlib)):
            out.write(json.dumps({"text": passage + " " + passage}) + "\n")
    return path


def held_out_pairs(count: int = PASSAGES, stdlib: Path | None = None) -> list[tuple[list[int], list[int]]]:
    """``count`` passages as token ids, (first occurrence, repeat), both within WINDOW tokens together; the repeat
    is tokenized after a space, as it follows the first occurrence in the corpus."""
    encoding = gpt2_encoding()
    pairs = []
    for passage in passages(HELD_OUT_SEED, stdlib):
        first, repeat = encoding.encode(passage), encoding.encode(" " + passage)
        if len(first) + len(repeat) <= WINDOW and len(repeat) >= 4:
            pairs.append((first, repeat))
        if len(pairs) == count:
            return pairs
    raise AssertionError("unreachable: passages() never ends")


def halves(run: TrainedRun, pairs: list[tuple[list[int], list[int]]]) -> dict[str, float]:
    """The mean loss (nats a token) on the first occurrences' targets and on the repeats' after their first token."""
    sums, counts = [0.0, 0.0], [0, 0]
    with torch.no_grad():
        for first, repeat in pairs:
            ids = torch.tensor([first + repeat], device=run.device)
            logprobs = run.model(ids[:, :-1]).float().log_softmax(-1)[0]
            loss = -logprobs.gather(-1, ids[0, 1:, None])[:, 0]  # loss[t] is the loss of token t + 1
            sums[0] += float(loss[: len(first) - 1].sum())
            counts[0] += len(first) - 1
            sums[1] += float(loss[len(first) :].sum())  # the repeat's tokens after its first
            counts[1] += len(repeat) - 1
    first_loss, repeat_loss = sums[0] / counts[0], sums[1] / counts[1]
    return {
        "first_occurrence_loss": round(first_loss, 4),
        "repeat_loss": round(repeat_loss, 4),
        "difference": round(first_loss - repeat_loss, 4),
    }


def load_text_run(run_dir: Path) -> TrainedRun:
    """The run at ``run_dir`` (its last checkpoint, one thread), refused unless it was trained on text."""
    run = load_trained_run(run_dir, ["train.num_threads=1"], "scripts/repeated_passages.py")
    require_text_run(run, "scoring text with it")
    return run


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "corpus":
        check_outputs({"out": args.out})
        check_writable({"out": args.out})
        args.out.parent.mkdir(parents=True, exist_ok=True)
        print(f"repeated_passages: wrote {write_corpus(args.out, args.rows)}", flush=True)
        return
    runs = [load_text_run(run_dir) for run_dir in args.run_dirs]  # every run checked before the first is scored
    pairs = held_out_pairs()
    for run_dir, run in zip(args.run_dirs, runs):
        record = {
            "run": f"{run_dir.parent.name}/{run_dir.name}",
            "step": run.checkpoint["step"],
            "embedding": run.cfg.model.embedding,
            **halves(run, pairs),
            "passages": len(pairs),
        }
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
