"""Training batches: every rank draws the same global batch and keeps its own rows.

The next batch is sampled, pinned and copied to the device (non-blocking) while the current step runs.
``sampler_state`` is the generator state *before* the pending batch was drawn: saved in checkpoints, it
makes a resumed run draw exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import torch

from training.distributed import DistInfo
from data import TokenArray, sample_batch


def rank_rows(global_batch: int, dist: DistInfo) -> slice:
    """The rows of a global batch that this rank trains on (train.batch_size is the global batch)."""
    rows = global_batch // dist.world_size
    return slice(dist.rank * rows, (dist.rank + 1) * rows)


class BatchStream:
    def __init__(self, tokens: TokenArray, global_batch: int, seq_len: int, seed: int, dist: DistInfo,
                 device: torch.device, state: torch.Tensor | None = None) -> None:
        self.tokens, self.global_batch, self.seq_len = tokens, global_batch, seq_len
        self.device, self.rows = device, rank_rows(global_batch, dist)
        self.generator = torch.Generator().manual_seed(seed)
        if state is not None:
            self.generator.set_state(state)
        self._pending = self._draw()

    def _draw(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._state_before = self.generator.get_state()
        x, y = sample_batch(self.tokens, self.global_batch, self.seq_len, self.generator)
        x, y = x[self.rows], y[self.rows]
        if self.device.type == "cuda":
            x, y = x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x, y

    @property
    def sampler_state(self) -> torch.Tensor:
        """Generator state from which the next batch returned by ``next()`` is drawn."""
        return self._state_before

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self._pending
        self._pending = self._draw()
        return batch
