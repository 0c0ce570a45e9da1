"""Training batches: every rank draws the same global batch and keeps its own rows.

The next batch is sampled, pinned and copied to the device (non-blocking) while the current step runs.
``sampler_state`` is the generator state *before* the pending batch was drawn: saved in checkpoints, it
makes a resumed run draw exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import torch

from core.distributed import DistInfo
from data import sample_batch


class BatchStream:
    def __init__(self, tokens, global_batch: int, seq_len: int, seed: int, dist: DistInfo, device: torch.device,
                 state: torch.Tensor | None = None) -> None:
        self.tokens, self.global_batch, self.seq_len = tokens, global_batch, seq_len
        self.dist, self.device = dist, device
        self.generator = torch.Generator().manual_seed(seed)
        if state is not None:
            self.generator.set_state(state)
        self.rows = global_batch // dist.world_size
        self._pending = self._draw()

    def _draw(self):
        self._state_before = self.generator.get_state()
        x, y = sample_batch(self.tokens, self.global_batch, self.seq_len, self.generator)
        mine = slice(self.dist.rank * self.rows, (self.dist.rank + 1) * self.rows)
        x, y = x[mine], y[mine]
        if self.device.type == "cuda":
            x, y = x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x, y

    @property
    def sampler_state(self) -> torch.Tensor:
        """Generator state from which the next batch returned by ``next()`` is drawn."""
        return self._state_before

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        batch, self._pending = self._pending, None
        self._pending = self._draw()
        return batch
