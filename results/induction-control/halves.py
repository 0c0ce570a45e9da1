"""In-distribution copying along a run: the loss on a passage's first occurrence and on its repeat (the targets
after the repeat's first token), over 300 passages drawn as make_corpus.py draws them but with another seed,
each with both occurrences within the training length (64 tokens). One JSON line per run directory given
(each scored at its checkpoints/last.pt); a model that copies scores the repeat far below the first occurrence.

    python halves.py probe/step_00000300 probe/step_00000600 ... > halves.jsonl
"""

import json
import sys
from pathlib import Path

import torch
from make_corpus import passages as draw_passages

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for its packages
from data.tokenizer import gpt2_encoding  # noqa: E402
from experiment.build import load_trained_run  # noqa: E402

encoding = gpt2_encoding()
passages = []
for passage in draw_passages(seed=12345):  # not the corpus's seed
    first, repeat = encoding.encode(passage), encoding.encode(" " + passage)
    if len(first) + len(repeat) <= 64 and len(repeat) >= 4:
        passages.append((first, repeat))
    if len(passages) == 300:
        break
for run in sys.argv[1:]:
    trained = load_trained_run(Path(run), ["train.num_threads=1"])
    sums, counts = [0.0, 0.0], [0, 0]
    with torch.no_grad():
        for first, repeat in passages:
            ids = torch.tensor([first + repeat])
            logprobs = trained.model(ids[:, :-1]).float().log_softmax(-1)[0]
            loss = -logprobs.gather(-1, ids[0, 1:, None])[:, 0]  # loss[t] is the loss of token t + 1
            sums[0] += float(loss[: len(first) - 1].sum())
            counts[0] += len(first) - 1
            sums[1] += float(loss[len(first) :].sum())  # the repeat's tokens after its first
            counts[1] += len(repeat) - 1
    first_loss, repeat_loss = sums[0] / counts[0], sums[1] / counts[1]
    print(
        json.dumps(
            {
                "run": f"{Path(run).parent.name}/{Path(run).name}",
                "step": trained.checkpoint["step"],
                "embedding": trained.cfg.model.embedding,
                "first_occurrence_loss": round(first_loss, 4),
                "repeat_loss": round(repeat_loss, 4),
                "difference": round(first_loss - repeat_loss, 4),
                "passages": len(passages),
            }
        ),
        flush=True,
    )
