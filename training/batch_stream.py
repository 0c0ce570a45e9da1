"""Training batches: every rank draws the same global batch and keeps its own rows.

The next batch is sampled, pinned and copied to the device (non-blocking) while the current step runs.
``sampler_state`` is the generator state *before* the pending batch was drawn: saved in checkpoints, it
makes a resumed run draw exactly the batches an uninterrupted one would.

Randomized positions (``train.random_positions=N``; Ruoss et al. 2023): each sequence also gets positions, a
sorted random subset of [0, N) (a task's instance: as many as its own tokens), drawn from the same generator right
after its tokens (so resume stays exact). PoSE (``train.pose``; Zhu et al. 2024) draws its chunked, skipped
positions the same way (data/windows.py, pose_positions).
"""

from __future__ import annotations

import torch

from data import TokenArray
from data.tasks import Task
from data.windows import PoSEConfig, draw_training_batch, pose_positions, random_positions
from training.distributed import DistInfo


def rank_rows(global_batch: int, dist: DistInfo) -> slice:
    """The rows of a global batch that this rank trains on (train.batch_size is the global batch)."""
    rows = global_batch // dist.world_size
    return slice(dist.rank * rows, (dist.rank + 1) * rows)


class BatchStream:
    def __init__(
        self,
        tokens: TokenArray | Task,
        global_batch: int,
        seq_len: int,
        seed: int,
        dist: DistInfo,
        device: torch.device,
        state: torch.Tensor | None = None,
        random_positions: int | None = None,
        pose: PoSEConfig | None = None,
    ) -> None:
        self.tokens, self.global_batch, self.seq_len = tokens, global_batch, seq_len
        self.random_positions = random_positions
        self.pose = pose if pose is not None and pose.target_len is not None else None
        self.device, self.rows = device, rank_rows(global_batch, dist)
        self.generator = torch.Generator().manual_seed(seed)
        if state is not None:
            self.generator.set_state(state)
        self._pending = self._draw()

    def _draw(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        self._state_before = self.generator.get_state()
        x, y, lengths = draw_training_batch(self.tokens, self.global_batch, self.seq_len, self.generator)
        batch = [x[self.rows], y[self.rows]]
        if self.random_positions:
            n = self.random_positions
            positions = random_positions(self.global_batch, self.seq_len, n, self.generator, lengths)
            batch.append(positions[self.rows])
        elif self.pose is not None:
            batch.append(pose_positions(self.global_batch, self.seq_len, self.pose, self.generator, lengths)[self.rows])
        if self.device.type == "cuda":
            batch = [t.pin_memory().to(self.device, non_blocking=True) for t in batch]
        return batch[0], batch[1], batch[2] if len(batch) > 2 else None

    @property
    def sampler_state(self) -> torch.Tensor:
        """Generator state from which the next batch returned by ``next()`` is drawn."""
        return self._state_before

    def next(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(x, y, positions): positions is None unless training with random positions or PoSE."""
        batch = self._pending
        self._pending = self._draw()
        return batch
