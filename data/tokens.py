"""A read-only token sequence stored across uint16 shard files."""

import functools
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np


@functools.lru_cache(maxsize=128)
def _open_shard(path: Path, version: tuple[int, int, int]) -> np.memmap:
    # Bounded because every open memmap holds a file descriptor, and a large corpus has many shards.
    # `version` (inode, mtime, size) keeps a shard that was written again from being read from an old map.
    return np.memmap(path, dtype=np.uint16, mode="r")


class TokenArray:
    """Tokens [start, stop) of the concatenation of some shard files, read without loading them.

    `read` copies one window out of the memory-mapped shards, so its cost depends on the window's length,
    not the corpus's.
    """

    def __init__(
        self,
        shards: Sequence[Path | str],
        start: int = 0,
        stop: int | None = None,
        name: str = "tokens",
        checksums: Sequence[str] | None = None,
    ):
        self.shards = [Path(shard) for shard in shards]
        self.name = name  # the split's name, for error messages and result rows
        self.checksums = list(checksums) if checksums is not None else None  # the shards' sha256, as the cache recorded
        stats = [shard.stat() for shard in self.shards]
        self._versions = [(stat.st_ino, stat.st_mtime_ns, stat.st_size) for stat in stats]
        sizes = [stat.st_size // np.dtype(np.uint16).itemsize for stat in stats]
        self._offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])  # where each shard starts
        stop = int(self._offsets[-1]) if stop is None else stop
        if not 0 <= start <= stop <= self._offsets[-1]:
            raise ValueError(f"[{start}, {stop}) is not within the shards' {self._offsets[-1]} tokens")
        self.start, self.stop = start, stop

    @property
    def digest(self) -> str | None:
        """sha256 of what identifies these tokens without reading them: the shards' checksums and the range
        (None when the shards' checksums are not known)."""
        if self.checksums is None:
            return None
        return hashlib.sha256(json.dumps([self.checksums, self.start, self.stop]).encode()).hexdigest()

    def __len__(self) -> int:
        return self.stop - self.start

    def __repr__(self) -> str:
        return f"TokenArray({self.name}: {len(self):,} tokens in {len(self.shards)} shards)"

    def read(self, start: int, length: int) -> np.ndarray:
        """A contiguous uint16 copy of tokens[start : start + length], across shard boundaries if need be."""
        if start < 0 or length < 0 or start + length > len(self):
            raise IndexError(f"cannot read [{start}, {start + length}) from {len(self)} tokens")
        out = np.empty(length, dtype=np.uint16)
        position, end = self.start + start, self.start + start + length
        while position < end:
            shard = int(np.searchsorted(self._offsets, position, side="right")) - 1
            begin = position - self._offsets[shard]
            count = min(end, self._offsets[shard + 1]) - position
            done = position - self.start - start
            out[done : done + count] = _open_shard(self.shards[shard], self._versions[shard])[begin : begin + count]
            position += count
        return out
