"""Perplexity at many context lengths: the length-extrapolation curve.

Every length and protocol scores the same targets: tokens [F, F + N) of the evaluation split, where F is
the longest evaluated length and N the largest multiple of it not above ``eval.max_tokens`` (and what the
split holds). So numbers are comparable across lengths, protocols, and runs evaluated on the same data
with the same ``eval.lengths`` and ``eval.max_tokens`` (each row records its ``target_range``; another
choice of either scores other tokens, which scripts/compare.py flags). Perplexity over scored targets T is

    ppl = exp( -(1/|T|) sum_{t in T} log p(x_t | x_{c(t)} .. x_{t-1}) )

and the protocols differ only in how much context c(t) each target gets:

- ``nonoverlapping`` (Press et al. 2022's default): the range is cut into windows of L targets, each scored
  on its own; the target at window position p (0-based) is predicted from the p + 1 tokens before it. When
  L does not divide N the last window is shorter.
- ``sliding``: windows of L tokens move by the stride S (``eval.stride``, default L/2; capped at L) and each
  scores only its last S targets, so every scored target is predicted from at least L - S + 1 tokens (F >= L
  leaves room for them before the first target; the final window may score fewer than S, with more context).
  S = L is ``nonoverlapping`` whenever L divides N; S = 1 predicts every target from a full window of L.
- ``streaming`` (StreamingLLM, Xiao et al. 2024): tokens are read one at a time with a KV cache that keeps the
  first k tokens (``eval.streaming_sinks``) and the L - k most recent, positions assigned within the cache;
  every scored target is predicted from exactly those L tokens (evaluation/streaming.py). Rows record k and the
  window L - k (``sinks``, ``window``).

For each (length, protocol) the mean loss at each position within the window is kept too: where it rises
past the training length is where a scheme breaks. At long lengths few windows fit in the scored range (32
at 1,024 of 32,768 tokens), so one position's mean is noise; ``per_position_bins`` averages positions in
log-spaced bins, merged until each bin holds at least MIN_BIN_TOKENS scored targets, and records every bin's
position range and token count. Each row also records the peak memory of its forward
passes (see evaluation/memory.py) and its wall time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm.auto import tqdm

from core.runtime import autocast
from evaluation.memory import PeakMemory
from evaluation.streaming import DEFAULT_SINKS, stream_losses

if TYPE_CHECKING:  # importing the data package pulls in `datasets`, slow to import: annotations only
    from data import TokenArray

PROTOCOLS = ("nonoverlapping", "sliding", "streaming")
BINS_PER_OCTAVE = 4  # log-spaced position bins: four per doubling of the position
MIN_BIN_TOKENS = 1024  # a bin's mean loss then has a standard error of ~0.08 nats (per-token sd ~2.5)


@dataclass(frozen=True)
class Window:
    start: int  # index of the first input token; targets are tokens start + 1 .. start + length
    length: int  # input tokens
    first_scored: int  # targets before this window position were scored by another window


def scored_range(n_tokens: int, lengths: list[int], max_tokens: int) -> tuple[int, int] | None:
    """(F, N): the targets [F, F + N) every length is scored on, or None when no length fits.

    A length fits when the split holds it twice (context before F plus one window of targets) and
    ``max_tokens`` holds it once. F is the longest fitting length, N a multiple of it.
    """
    fitting = [length for length in lengths if 2 * length <= n_tokens and length <= max_tokens]
    if not fitting:
        return None
    longest = max(fitting)
    return longest, min(max_tokens, n_tokens - longest) // longest * longest


def effective_stride(length: int, stride: int | None) -> int:
    """The sliding stride used at this length: eval.stride (default L/2), at most L so no target is skipped."""
    return min(length, stride or max(1, length // 2))


def window_plan(first: int, n_targets: int, length: int, protocol: str, stride: int | None = None) -> list[Window]:
    """The windows that score targets [first, first + n_targets) exactly once, in order."""
    step = length if protocol == "nonoverlapping" else effective_stride(length, stride)
    plan = []
    for block_start in range(first, first + n_targets, step):
        block_stop = min(block_start + step, first + n_targets)
        if protocol == "nonoverlapping":  # the window is the block itself: no context before it
            plan.append(Window(block_start - 1, block_stop - block_start, 0))
        else:  # L tokens ending at the block's last target; earlier targets are context only
            plan.append(Window(block_stop - 1 - length, length, length - (block_stop - block_start)))
    return plan


def _batches(plan: list[Window], per_batch: int) -> list[list[Window]]:
    """Consecutive windows of equal length, at most per_batch to a batch."""
    batches: list[list[Window]] = []
    for window in plan:
        if batches and len(batches[-1]) < per_batch and batches[-1][0].length == window.length:
            batches[-1].append(window)
        else:
            batches.append([window])
    return batches


def _device_batch(
    tokens: TokenArray, windows: list[Window], rows: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of the windows (targets -100 where not scored), padded to ``rows`` rows."""
    length = windows[0].length
    data = np.stack([tokens.read(w.start, length + 1).astype(np.int64) for w in windows])
    x, y = torch.from_numpy(data[:, :-1]), torch.from_numpy(data[:, 1:]).clone()
    for row, window in enumerate(windows):
        y[row, : window.first_scored] = -100
    if rows > len(windows):  # repeat the last window, scoring nothing, to keep one shape per length
        pad = rows - len(windows)
        x = torch.cat((x, x[-1:].expand(pad, -1)))
        y = torch.cat((y, torch.full((pad, length), -100, dtype=y.dtype)))
    return x.to(device), y.to(device)


def _scored_batches(
    model: torch.nn.Module,
    tokens: TokenArray,
    plan: list[Window],
    batch_tokens: int,
    device: torch.device,
    dtype: torch.dtype,
    progress: bool,
    description: str,
) -> Iterator[tuple[list[Window], int, torch.Tensor, torch.Tensor]]:
    """Each batch of ``plan``'s windows with its first scored window position, the per-target losses from there on
    (B, T - first; 0 where a target is not scored) and the targets (B, T; -100 where not scored)."""
    length = max(w.length for w in plan)
    per_batch = max(1, batch_tokens // length)
    for batch in tqdm(_batches(plan, per_batch), desc=description, disable=not progress, leave=False, unit="batch"):
        # On CUDA, compiled kernels (FlexAttention) specialise on shapes: a short last batch would recompile.
        full = min(per_batch, len(plan))
        rows = full if device.type == "cuda" and batch[0].length == length else len(batch)
        x, y = _device_batch(tokens, batch, rows, device)
        # Positions before every window's first scored one are context only: no head computed for them.
        first = min(w.first_scored for w in batch)
        with autocast(device, dtype):
            losses = model(x, y, reduction="none", score_from=first).double()
        yield batch, first, losses, y


@torch.inference_mode()
def score_windows(
    model: torch.nn.Module,
    tokens: TokenArray,
    plan: list[Window],
    batch_tokens: int,
    device: torch.device,
    dtype: torch.dtype,
    progress: bool = False,
    description: str = "",
) -> dict[str, Any]:
    """Scored-token count, mean loss, perplexity and per-position mean loss over the windows of ``plan``."""
    length = max(w.length for w in plan)
    loss_sum = torch.zeros(length, dtype=torch.float64, device=device)
    counts = torch.zeros(length, dtype=torch.float64, device=device)
    for _, first, losses, y in _scored_batches(model, tokens, plan, batch_tokens, device, dtype, progress, description):
        loss_sum[first : y.shape[1]] += losses.sum(0)
        counts[first : y.shape[1]] += (y[:, first:] != -100).sum(0)
    return summarize(loss_sum, counts)


@torch.inference_mode()
def target_losses(
    model: torch.nn.Module,
    tokens: TokenArray,
    plan: list[Window],
    batch_tokens: int,
    device: torch.device,
    dtype: torch.dtype,
    progress: bool = False,
    description: str = "",
) -> tuple[np.ndarray, np.ndarray]:
    """Per target the plan scores, in order from its first: the loss (nats, float64) and the number of tokens it
    was predicted from. The same windows, batches and head as :func:`score_windows`, so the losses are the ones
    a row of that plan averages (evaluation/key_tokens.py compares them target by target)."""
    first_target = plan[0].start + 1 + plan[0].first_scored  # the first target the plan scores
    n_targets = sum(w.length - w.first_scored for w in plan)
    losses, contexts = np.full(n_targets, np.nan), np.zeros(n_targets, dtype=np.int64)
    for batch, first, batch_losses, _ in _scored_batches(
        model, tokens, plan, batch_tokens, device, dtype, progress, description
    ):
        batch_losses = batch_losses.cpu().numpy()
        for row, window in enumerate(batch):
            positions = np.arange(window.first_scored, window.length)  # window position p predicts start + 1 + p
            targets = window.start + 1 + positions - first_target
            losses[targets] = batch_losses[row, positions - first]
            contexts[targets] = positions + 1
    return losses, contexts


def summarize(loss_sum: torch.Tensor, counts: torch.Tensor) -> dict[str, Any]:
    """Scored-token count, mean loss, perplexity and per-position mean loss from per-position loss sums and
    scored-target counts (float64, one entry per position within the window)."""
    loss, n = float(loss_sum.sum()) / float(counts.sum()), int(counts.sum())
    # JSON has no NaN or inf: positions never scored, or a model whose loss is not finite, give null.
    per_position = [s / c if c > 0 and math.isfinite(s) else None for s, c in zip(loss_sum.tolist(), counts.tolist())]
    result = {
        "tokens": n,
        "loss": loss,
        "ppl": perplexity(loss),
        "per_position_loss": per_position,
        "per_position_bins": position_bins(loss_sum.tolist(), counts.tolist()),
    }
    if not math.isfinite(loss):
        result.update(loss=None, ppl=None, reason="the loss is not finite")
    elif math.isinf(result["ppl"]):  # stored as null beside its finite loss: readers take it as inf (row_ppl)
        result.update(ppl=None, reason=f"perplexity exp({loss:.4g}) is too large for a float: inf")
    return result


def perplexity(loss: float) -> float:
    """exp(loss); inf where that exceeds the float range (a loss above ~709.8 nats: a diverged model)."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def position_bins(
    loss_sums: list[float], counts: list[float], min_tokens: int = MIN_BIN_TOKENS
) -> list[dict[str, Any]]:
    """Per-position losses pooled over bins of 1-based window positions [lo, hi).

    Bins start log-spaced (BINS_PER_OCTAVE per doubling, so equally wide on a log axis), then neighbours
    are merged until each holds ``min_tokens`` scored targets; a short remainder joins the last full bin.
    Positions no window scored (before L - S + 1 in the sliding protocol) are left out. Each bin:
    {"positions": [lo, hi], "loss": mean loss of its targets (None if not finite), "tokens": their number}.
    """
    length = len(counts)
    n_bins = math.ceil(math.log2(length + 1) * BINS_PER_OCTAVE)
    edges = np.unique(np.geomspace(1, length + 1, n_bins + 1).round().astype(int)).tolist()
    bins: list[list[float]] = []  # [lo, hi, loss sum, tokens]
    pending = None
    for lo, hi in zip(edges[:-1], edges[1:]):
        tokens = sum(counts[lo - 1 : hi - 1])
        if tokens == 0:
            continue
        if pending is None:  # starts at its first scored position
            pending = [next(p for p in range(lo, hi) if counts[p - 1]), hi, 0.0, 0.0]
        pending[1:] = [hi, pending[2] + sum(loss_sums[lo - 1 : hi - 1]), pending[3] + tokens]
        if pending[3] >= min_tokens:
            bins.append(pending)
            pending = None
    if pending is not None:
        if bins:  # too few tokens for a bin of its own
            last = bins[-1]
            last[1:] = [pending[1], last[2] + pending[2], last[3] + pending[3]]
        else:
            bins.append(pending)
    return [
        {
            "positions": [int(lo), int(hi)],
            "loss": total / tokens if math.isfinite(total) else None,
            "tokens": int(tokens),
        }
        for lo, hi, total, tokens in bins
    ]


def evaluate_extrapolation(
    model: torch.nn.Module,
    tokens: TokenArray,
    lengths: list[int],
    protocols: list[str],
    stride: int | None,
    max_tokens: int,
    batch_tokens: int,
    device: torch.device,
    dtype: torch.dtype,
    progress: bool = True,
    description: str = "",
    sinks: int = DEFAULT_SINKS,
) -> list[dict[str, Any]]:
    """One row per (length, protocol). Lengths that cannot be scored get loss and ppl None and a reason.
    ``sinks``: the streaming protocol's k."""
    model.eval()
    span = scored_range(len(tokens), lengths, max_tokens)
    rows = []
    jobs = [(length, protocol) for length in dict.fromkeys(lengths) for protocol in dict.fromkeys(protocols)]
    for length, protocol in tqdm(jobs, desc=f"eval {description}".strip(), disable=not progress, unit="length"):
        row: dict[str, Any] = {
            "length": length,
            "protocol": protocol,
            "stride": effective_stride(length, stride) if protocol == "sliding" else None,
            **({"sinks": sinks, "window": length - sinks} if protocol == "streaming" else {}),
        }
        if reason := model.pe.beyond_reach(length):
            row.update(tokens=0, loss=None, ppl=None, reason=reason)
        elif span is None or length > span[0]:  # span[0] is the longest length that fits
            row.update(
                tokens=0,
                loss=None,
                ppl=None,
                reason=f"needs 2x{length} tokens in the split ({len(tokens)}) and "
                f"eval.max_tokens ({max_tokens}) >= {length}",
            )
        else:
            first, n_targets = span
            started = time.perf_counter()
            what = f"L={length} {protocol}"
            with PeakMemory(device) as memory:
                if protocol == "streaming":
                    sums = stream_losses(
                        model, tokens, first, n_targets, length, sinks, batch_tokens, device, dtype, progress, what
                    )
                    row.update(summarize(*sums))
                else:
                    plan = window_plan(first, n_targets, length, protocol, stride)
                    row.update(score_windows(model, tokens, plan, batch_tokens, device, dtype, progress, what))
            row.update(
                target_range=[first, first + n_targets],
                peak_memory_mb=memory.peak_mb,
                memory_metric=memory.metric,
                seconds=round(time.perf_counter() - started, 3),
            )
        rows.append(row)
    return rows
