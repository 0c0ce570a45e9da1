"""Peak memory of a block of work: the one measurement used by evaluation rows and scripts/speed.py.

``with PeakMemory(device) as m: ...`` then ``m.peak_mb``: the most memory in use at any moment during the
block, in MiB (2**20 bytes), what was already in use when it began included (the model's weights, say).
What is measured is named in ``m.metric``:

- ``cuda_max_allocated``: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` — the peak
  of tensors allocated on the GPU during the block, model weights included (the caching allocator's reserve
  and the CUDA context are not).
- ``cpu_peak_rss``: the process's peak resident set size (VmHWM in /proc/self/status) during the block,
  reset at its start by writing 5 to /proc/self/clear_refs (Linux >= 4.0). Process-level: it includes the
  interpreter, torch, the weights and memory an earlier block freed but the allocator kept.
- ``cpu_peak_rss_since_start``: where that reset is not possible, ``getrusage``'s ru_maxrss, the process's
  peak since it started; it can only grow, so it bounds the block's peak from above.
"""

from __future__ import annotations

import gc
import resource
import sys
from pathlib import Path

import torch

_MB = 2**20


def _vm_hwm_bytes() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def resident_mb() -> float | None:
    """The process's resident set size now (VmRSS), in MiB; None where /proc is not readable."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / _MB
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return _vm_hwm_bytes() is not None


def _max_rss_bytes() -> int:
    # ru_maxrss is in kilobytes on Linux, bytes on macOS.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


class PeakMemory:
    """``with PeakMemory(device) as m: ...`` then ``m.peak_mb`` (MiB) and ``m.metric`` (see the module's docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.metric = ""
        self.peak_mb: float | None = None

    def __enter__(self) -> PeakMemory:
        gc.collect()  # what earlier work left for the collector should not count
        # Everything still tracked is alive: set it apart, so that the next block's collection walks only what
        # is newer instead of the libraries' hundreds of thousands of objects again each time.
        # Reference counting still frees these objects; only a cycle among them would now be kept.
        gc.freeze()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.metric = "cuda_max_allocated"
        elif _reset_peak_rss():
            self.metric = "cpu_peak_rss"
        else:
            self.metric = "cpu_peak_rss_since_start"
        return self

    def __exit__(self, *exc) -> None:
        if self.metric == "cuda_max_allocated":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        elif self.metric == "cpu_peak_rss":
            peak = _vm_hwm_bytes()
        else:
            peak = _max_rss_bytes()
        self.peak_mb = round(peak / _MB, 1)
