"""Zero-shot retrieval on a language-model run (``eval.tasks=[copy_probe]``): does the model copy from the
far context of ordinary text?

Each example is a window of L held-out tokens (the evaluation split, at a random start) in which a span of
S = eval.copy_span random tokens is written twice: the second copy ends the window, at [L - S, L), the first
starts d tokens before it, at [L - S - d, L - d). The span's tokens are drawn uniformly, with replacement, from
K candidates: by default every token but <|endoftext|> (K = 50,256, Olsson et al. 2022's random tokens); with
eval.copy_min_count = N > 0 only the tokens that occur at least N times in the training split of data.* (the
corpus the run was trained on, unless data.* is overridden). A small corpus leaves most of GPT-2's vocabulary
unseen (the embedded corpus holds 22,709 distinct tokens), and a token whose embedding was never trained can be
hard to copy even for a model that copies the tokens it knows; N tells the two apart.
A model that uses the far context predicts the repeat's tokens after its first one (S - 1 targets) from
the first copy; one that does not can only guess (1 in K, a mean log-probability of -ln K). Per cell (L, d):

- accuracy: the share of examples whose S - 1 targets are all the argmax (exact match, teacher forcing),
  with its 95% Wilson interval; n examples as for tasks (eval.task_half_width);
- token_accuracy: the share of those targets that are the argmax;
- mean_logprob: their mean log-probability (nats);
- control_logprob: the same, on the same windows and span without the first copy (the text left there);
- copy_gain: mean_logprob - control_logprob, what the first copy adds (nats): 0 for a model that does not
  look back at it, ln K at most for one that guesses uniformly without it. It separates copying from
  what a model can guess of the span's tokens without it (the frequent ones, under eval.copy_min_count).

Distances: d = l - S for each evaluated length l <= L (so at d = L - S the first copy opens the window). The
windows and spans are drawn once a length (seeded by the run's seed and L), and every distance writes its first
copy into the same ones: the distances of a length are compared on the same text, and the control, the same for
all of them, is scored once.
Rows go to eval/tasks.json as ``task: copy_probe`` with a ``distance`` (evaluation/task_accuracy.py writes them), and
record the span, eval.copy_min_count and K (``copy_candidates``): probes of other settings stay beside them.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from core.domain import choice, domain
from core.errors import PosGPTError
from core.runtime import autocast
from data import EOT_TOKEN, TokenArray, describe_corpus, load_split
from data.config import DataConfig
from data.tasks import held_out_seed
from evaluation.context import EvalContext, EvaluationPlan
from evaluation.results import COPY_PROBE, PROBES
from evaluation.settings import TEXT, AccuracyInterval, Batching
from evaluation.task_accuracy import examples_for, wilson_interval

NAME = COPY_PROBE
COUNT_CHUNK = 1 << 24  # tokens counted at a time, so that a large training split is never read whole
_COUNTED_CANDIDATES: dict[tuple[str, int, int], torch.Tensor] = {}  # probe_candidates' (data.*, N, vocab) -> ids


def span_candidates(
    vocab: int, min_count: int = 0, train_tokens: TokenArray | None = None, progress: bool = False
) -> torch.Tensor:
    """The token ids a span is drawn from, ascending: every id but <|endoftext|>, or with ``min_count`` > 0 those
    that occur at least ``min_count`` times in ``train_tokens``."""
    if min_count == 0:
        ids = torch.arange(vocab)
        return ids[ids != EOT_TOKEN]
    if train_tokens is None:
        raise ValueError("eval.copy_min_count > 0 needs the training split's tokens")
    counts = np.zeros(max(vocab, 1 << 16), dtype=np.int64)
    chunks = range(0, len(train_tokens), COUNT_CHUNK)
    for start in tqdm(chunks, desc="copy probe: counting tokens", disable=not progress, leave=False, unit="chunk"):
        chunk = train_tokens.read(start, min(COUNT_CHUNK, len(train_tokens) - start))
        counts += np.bincount(chunk, minlength=len(counts))
    ids = torch.from_numpy(np.flatnonzero(counts[:vocab] >= min_count))
    return ids[ids != EOT_TOKEN]


def probe_windows(
    tokens: TokenArray, n: int, length: int, span: int, candidates: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """(n, length) windows of held-out text, each ending in a span of random ``candidates``: the control, to
    which :func:`with_first_copy` writes the first copy."""
    starts = torch.randint(0, len(tokens) - length + 1, (n,), generator=generator)
    windows = torch.from_numpy(np.stack([tokens.read(int(s), length) for s in starts]).astype(np.int64))
    windows[:, length - span :] = candidates[torch.randint(0, len(candidates), (n, span), generator=generator)]
    return windows


def with_first_copy(windows: torch.Tensor, distance: int, span: int) -> torch.Tensor:
    """The windows with their final span written again ``distance`` tokens earlier, over the text there."""
    length = windows.shape[1]
    copied = windows.clone()
    copied[:, length - span - distance : length - distance] = windows[:, length - span :]
    return copied


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


@dataclass(frozen=True, kw_only=True)
class ProbeSettings(AccuracyInterval, Batching):
    """The eval.* settings the copy probe reads: its own, and those it shares (evaluation/settings.py)."""

    # Zero-shot probes of a language-model run, after its perplexity: [copy_probe] (evaluation/copy_probe.py)
    tasks: tuple[str, ...] = choice([], PROBES, runs=TEXT)
    copy_span: int = domain(16, ge=2, used_with=("tasks", PROBES))  # tokens in the copy probe's repeated span
    # Which tokens the span is drawn from: 0, any but <|endoftext|> (Olsson et al.'s random tokens); N > 0, only
    # tokens that occur at least N times in the training split (tokens whose embeddings the run has learned)
    copy_min_count: int = domain(0, ge=0, used_with=("tasks", PROBES))

    def check(self, plan: EvaluationPlan) -> None:
        """The probe writes its span twice in a window: it needs a length longer than the span, else it writes no
        row at all."""
        if (self.tasks or NAME in plan.evaluators) and self.copy_span >= max(plan.lengths):  # its switch, or by name
            raise PosGPTError(
                f"eval.copy_span={self.copy_span} is not shorter than any evaluation length (the longest is "
                f"{max(plan.lengths)}): the copy probe writes its span twice in a window, so it would score nothing; "
                "lower eval.copy_span"
            )


def probe_candidates(data: DataConfig, min_count: int, vocab: int, progress: bool = False) -> torch.Tensor:
    """The token ids the probe's span is drawn from under eval.copy_min_count (``min_count``, counted in the
    training split of ``data``); PosGPTError, naming the setting, when fewer than 2 are left. Evaluations call it
    before they score anything, and training before its first step, so that a setting the probe refuses costs no
    perplexity evaluation, nor training, first. The training split is counted once a process (training's check,
    then its end-of-training evaluation, ask for the same)."""
    key = (json.dumps(dataclasses.asdict(data), sort_keys=True), min_count, vocab)
    if key not in _COUNTED_CANDIDATES:
        train_tokens = load_split(data, "train", progress) if min_count else None
        _COUNTED_CANDIDATES[key] = span_candidates(vocab, min_count, train_tokens, progress)
    candidates = _COUNTED_CANDIDATES[key]
    if len(candidates) < 2:
        raise PosGPTError(
            f"eval.copy_min_count={min_count} leaves {len(candidates)} token(s) of the training split of "
            f"{data.name} to draw the copy probe's span from: lower it"
        )
    return candidates


def probe_length(
    ctx: EvalContext,
    e: ProbeSettings,
    tokens: TokenArray,
    candidates: torch.Tensor,
    fields: dict[str, Any],
    distances: list[int],
) -> list[dict[str, Any]]:
    """The rows of one length, a distance each, each starting with ``fields`` (what every row of the length
    records: its length, variation and provenance). One draw of windows and spans serves every distance, so its
    control is scored once and the distances are compared on the same text."""
    model = ctx.model
    length, span, n = fields["length"], e.copy_span, examples_for(e.task_half_width)
    seed = held_out_seed(ctx.train_seed, f"{NAME}:{length}")
    fields = {**fields, "seed": seed}
    reason = model.pe.beyond_reach(length)
    if reason is None and len(tokens) < length:
        reason = f"the {tokens.name} split has fewer than {length} tokens"
    if reason is not None or not distances:
        return [{**fields, "distance": d, "accuracy": None, "n": 0, "reason": reason} for d in distances]
    started = time.perf_counter()
    control = probe_windows(tokens, n, length, span, candidates, torch.Generator().manual_seed(seed))
    *_, control_logprob = score_copies(model, control, span, e.batch_tokens, ctx.device, ctx.dtype)
    control_seconds = (time.perf_counter() - started) / len(distances)  # shared by the length's cells
    rows = []
    for distance in distances:
        started = time.perf_counter()
        windows = with_first_copy(control, distance, span)
        exact, right, logprob = score_copies(model, windows, span, e.batch_tokens, ctx.device, ctx.dtype)
        low, high = wilson_interval(exact, n)
        targets = n * (span - 1)
        rows.append(
            {
                **fields,
                "distance": distance,
                "accuracy": exact / n,
                "ci_low": low,
                "ci_high": high,
                "correct": exact,
                "n": n,
                "token_accuracy": right / targets,
                "mean_logprob": logprob / targets,
                "control_logprob": control_logprob / targets,
                "copy_gain": (logprob - control_logprob) / targets,
                "seconds": round(time.perf_counter() - started + control_seconds, 3),
            }
        )
    return rows


def probe_rows(
    ctx: EvalContext, e: ProbeSettings, tokens: TokenArray, candidates: torch.Tensor
) -> list[dict[str, Any]]:
    """Every (variation, length, distance) cell; the span is drawn from ``candidates`` (probe_candidates)."""
    # what the rows scored; the probe's settings too, since rows of other settings stay in tasks.json beside them
    probe = {"copy_span": e.copy_span, "copy_min_count": e.copy_min_count, "copy_candidates": len(candidates)}
    provenance = {"data": ctx.data.name, "corpus": describe_corpus(ctx.data), "split": tokens.name, **probe}
    lengths = list(dict.fromkeys(ctx.lengths))
    rows = []
    for _, setting in ctx.variations():
        for length in lengths:
            distances = [d - e.copy_span for d in lengths if e.copy_span < d <= length]
            fields = {"task": NAME, "length": length, **setting, **provenance}
            rows += probe_length(ctx, e, tokens, candidates, fields, distances)
    return rows
