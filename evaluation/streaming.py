"""The ``streaming`` protocol: StreamingLLM's attention sinks plus a window of recent tokens (Xiao et al. 2024,
"Efficient Streaming Language Models with Attention Sinks", sec. 3.2).

The text is read one token at a time with a KV cache that keeps the first k tokens of the stream (the attention
sinks, ``eval.streaming_sinks``, 4 in the paper) and the w most recent ones, and drops those in between. At the
evaluated length L the cache holds at most L = k + w tokens, the span every protocol's length bounds, so
w = L - k. Positions are those within the cache, as the paper assigns them ("if the current cache has tokens
[0, 1, 2, 3, 6, 7, 8] and is decoding the 9th token, the positions assigned are [0, 1, ..., 7]"): keys are kept
unrotated and every step rotates (or biases, or embeds) them at their place in the cache, for every scheme
(model/gpt.py's KVCache.unrotated, the paper's "pos_shift"). The keys and values a token leaves in the cache are
those computed when it was read, with the context it had then: nothing is recomputed, as in a streaming
deployment. k = 0 is the paper's "window attention" baseline with re-indexed positions.

Exact, and batched across streams rather than across time. Tokens of one stream cannot share a forward pass:
two queries read at different steps see their sinks at different distances (the sinks stay at 0 .. k-1 while
the window shifts), so no one set of key positions serves both. Instead the scored targets [F, F + N) are cut
into R contiguous runs, one stream each, and the R streams advance together, one token per step, as the rows of
a batch (R = eval.batch_tokens / L, at most N / L so that warm-up stays below the scored tokens). Stream r starts
L tokens before its first target, so that target already sees a full cache of L tokens; its first k tokens are
its sinks. So each stream is StreamingLLM run from its own first token (the paper streams a whole book from its
first token); the L warm-up targets of each stream are read, not scored. Every scored target is predicted from
exactly k sinks and the w most recent tokens, the query at cache position L - 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from tqdm.auto import tqdm

from core.runtime import autocast
from model.gpt import KVCache

if TYPE_CHECKING:  # importing the data package pulls in `datasets`, slow to import: annotations only
    from data import TokenArray

DEFAULT_SINKS = 4  # StreamingLLM's choice: "four initial tokens as attention sinks suffice"


@dataclass
class StreamingCache(KVCache):
    """A KV cache that keeps the first ``sinks`` tokens and the last ``window - 1`` after each step (with the
    next token, ``window`` recent ones), keys unrotated (re-indexed positions)."""

    sinks: int = DEFAULT_SINKS
    window: int = 1
    unrotated: bool = True

    def kept(self, t: torch.Tensor, dim: int = -2) -> torch.Tensor:
        n, recent = t.shape[dim], self.window - 1
        if n <= self.sinks + recent:
            return t
        return torch.cat((t.narrow(dim, 0, self.sinks), t.narrow(dim, n - recent, recent)), dim=dim)


def stream_count(n_targets: int, length: int, batch_tokens: int) -> int:
    """R: streams of one batch, at most batch_tokens / L (the cache's size) and N / L (warm-up <= scored)."""
    return max(1, min(batch_tokens // length, n_targets // length))


@torch.inference_mode()
def stream_losses(
    model: torch.nn.Module,
    tokens: TokenArray,
    first: int,
    n_targets: int,
    length: int,
    sinks: int,
    batch_tokens: int,
    device: torch.device,
    dtype: torch.dtype,
    progress: bool = False,
    description: str = "",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss sums and counts (float64, (L,), by cache position of the query) of targets [first, first + n_targets)
    under the streaming protocol at length L = sinks + window (module docstring). Needs first >= L."""
    streams = stream_count(n_targets, length, batch_tokens)
    run = math.ceil(n_targets / streams)  # targets per stream; the last stream may have fewer
    steps = length + run - 1  # inputs per stream: L - 1 of warm-up before the first scored target
    inputs = np.zeros((streams, steps + 1), dtype=np.int64)
    scored = np.zeros((streams, steps), dtype=bool)
    for r in range(streams):
        start = first + r * run - length  # the stream's first input token: its sinks start here
        stop = min(first + (r + 1) * run, first + n_targets)  # one past its last target
        inputs[r, : stop - start] = tokens.read(start, stop - start).astype(np.int64)
        scored[r, length - 1 : stop - start - 1] = True  # target start + s + 1 of step s, from F + r run on
    x = torch.from_numpy(inputs).to(device)
    targets = torch.from_numpy(np.where(np.pad(scored, ((0, 0), (1, 0))), inputs, -100)[:, 1:]).to(device)
    loss_sum = torch.zeros(length, dtype=torch.float64, device=device)
    counts = torch.zeros(length, dtype=torch.float64, device=device)
    cache = StreamingCache(sinks=sinks, window=length - sinks)
    for step in tqdm(range(steps), desc=description, disable=not progress, leave=False, unit="token"):
        y = targets[:, step : step + 1]
        with autocast(device, dtype):
            losses = model(x[:, step : step + 1], y, reduction="none", cache=cache).double()
        position = min(step, length - 1)  # the query's place in the cache
        loss_sum[position] += losses.sum()
        counts[position] += (y != -100).sum()
    return loss_sum, counts
