"""Zero-shot retrieval on a language-model run (``eval.tasks=[copy_probe]``): does the model copy from the
far context of ordinary text?

Each example is a window of L held-out tokens (the evaluation split, at a random start) in which a span of
S = eval.copy_span random tokens (uniform over the vocabulary but <|endoftext|>) is written twice: the
second copy ends the window, at [L - S, L), the first starts d tokens before it, at [L - S - d, L - d).
A model that uses the far context predicts the repeat's tokens after its first one (S - 1 targets) from
the first copy; one that does not can only guess (1 in 50,256). Per cell (L, d):

- accuracy: the share of examples whose S - 1 targets are all the argmax (exact match, teacher forcing),
  with its 95% Wilson interval; n examples as for tasks (eval.task_half_width);
- token_accuracy: the share of those targets that are the argmax;
- mean_logprob: their mean log-probability (nats).

Distances: d = l - S for each evaluated length l <= L (so at d = L - S the first copy opens the window).
Rows go to eval/tasks.json as ``task: copy_probe`` with a ``distance`` (evaluation/tasks.py writes them).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from core.runtime import autocast
from data import EOT_TOKEN, TokenArray, describe_corpus
from data.tasks import held_out_seed
from evaluation.run import variation_fields
from evaluation.tasks import examples_for, wilson_interval, write_task_results
from experiment.config import eval_lengths

NAME = "copy_probe"


def probe_windows(
    tokens: TokenArray, n: int, length: int, distance: int, span: int, vocab: int, generator: torch.Generator
) -> torch.Tensor:
    """(n, length) windows of held-out text with a random span written at length - span - distance and at the end."""
    starts = torch.randint(0, len(tokens) - length + 1, (n,), generator=generator)
    windows = torch.from_numpy(np.stack([tokens.read(int(s), length) for s in starts]).astype(np.int64))
    draws = torch.randint(0, vocab - 1, (n, span), generator=generator)
    copy = draws + (draws >= EOT_TOKEN).long()  # every token but <|endoftext|>
    windows[:, length - span :] = copy
    windows[:, length - span - distance : length - distance] = copy
    return windows


@torch.inference_mode()
def score_copies(
    model: torch.nn.Module, windows: torch.Tensor, span: int, batch_tokens: int, device: torch.device, dtype
) -> tuple[int, int, float]:
    """(examples all right, targets right, summed log-probability) over the repeat's tokens after its first.
    Only those S - 1 positions' logits are computed (a full vocabulary at every position would not fit)."""
    length = windows.shape[1]
    exact = right = 0
    logprob = 0.0
    for batch in windows.split(max(1, batch_tokens // length)):
        batch = batch.to(device)
        targets = batch[:, length - span + 1 :]
        with autocast(device, dtype):
            hidden = model.hidden_states(batch)[:, length - span : length - 1]
        logits = (hidden.float() @ model.head_weight.float().t())[..., : model.vocab_size]
        logprobs = logits.log_softmax(dim=-1)
        hits = logits.argmax(dim=-1) == targets
        exact += int(hits.all(dim=1).sum())
        right += int(hits.sum())
        logprob += float(logprobs.gather(-1, targets.unsqueeze(-1)).sum())
    return exact, right, logprob


def run_copy_probe(
    cfg: DictConfig,
    model: torch.nn.Module,
    tokens: TokenArray,
    run_dir: str | Path,
    device: torch.device,
    dtype: torch.dtype,
    trained_config: dict[str, Any],
    wandb_run=None,
    step: int | None = None,
) -> dict[str, Any]:
    """Every (variation, length, distance) cell, written with the task results (evaluation/tasks.py)."""
    n, span, lengths = examples_for(cfg.eval.task_half_width), cfg.eval.copy_span, eval_lengths(cfg)
    limit = model.pe.max_positions()
    # what the rows scored; the span too, since rows of other spans stay in tasks.json beside them
    provenance = {"data": cfg.data.name, "corpus": describe_corpus(cfg.data), "split": tokens.name, "copy_span": span}
    rows = []
    for label, settings in model.pe.eval_variations(list(cfg.eval.variations or [])):
        setting = variation_fields(label, settings, cfg)
        with model.pe.evaluated_with(settings):
            for length in dict.fromkeys(lengths):
                for distance in [d - span for d in dict.fromkeys(lengths) if span < d <= length]:
                    seed = held_out_seed(cfg.train.seed, f"{NAME}:{length}:{distance}")
                    row = {"task": NAME, "length": length, "distance": distance, **setting, **provenance, "seed": seed}
                    if limit is not None and length > limit:
                        row.update(accuracy=None, n=0, reason=f"pe={model.pe.name} encodes at most {limit} positions")
                    elif len(tokens) < length:
                        row.update(accuracy=None, n=0, reason=f"the {tokens.name} split has fewer than {length} tokens")
                    else:
                        started = time.perf_counter()
                        generator = torch.Generator().manual_seed(seed)
                        windows = probe_windows(tokens, n, length, distance, span, model.vocab_size, generator)
                        exact, right, logprob = score_copies(model, windows, span, cfg.eval.batch_tokens, device, dtype)
                        low, high = wilson_interval(exact, n)
                        targets = n * (span - 1)
                        row.update(
                            accuracy=exact / n,
                            ci_low=low,
                            ci_high=high,
                            correct=exact,
                            n=n,
                            token_accuracy=right / targets,
                            mean_logprob=logprob / targets,
                            seconds=round(time.perf_counter() - started, 3),
                        )
                    rows.append(row)
    extra = {"accuracy": "exact match of the repeat's tokens after its first (teacher forcing); 95% Wilson intervals"}
    return write_task_results(cfg, NAME, rows, {**extra, "copy_span": span}, run_dir, trained_config, wandb_run, step)
