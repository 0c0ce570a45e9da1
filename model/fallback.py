"""A kernel given up at its first failure, and what runs instead: the one fallback of the code base.

Something that may fail on a machine where it is not supported (FlexAttention's or a scheme's Triton kernel, a
torch.compile'd training step) gets a :class:`Fallback` when it is built. The first failure is warned once, its reason
kept in ``failure`` (what the runs' records read), and ``instead`` runs from then on; a user's mistake (PosGPTError)
and running out of memory are raised, as what runs instead would fail alike. Inside an enclosing torch.compile the
first choice is traced as it is: that compilation falls back as a whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from core.errors import PosGPTError, first_line, warn


class Fallback:
    """``failed``: what the warning says failed ("FlexAttention failed"); ``then``: what happens from then on."""

    def __init__(self, failed: str, then: str) -> None:
        self.failed, self.then = failed, then
        self.failure: str | None = None  # why it was given up (None while it works)

    def run(self, first: Callable[..., Any], instead: Callable[..., Any], *args: Any) -> Any:
        """``first(*args)`` while it works; ``instead(*args)`` from its first failure on (this call included)."""
        if self.failure is not None:
            return instead(*args)
        if torch.compiler.is_compiling():
            return first(*args)
        try:
            return first(*args)
        except (PosGPTError, torch.OutOfMemoryError):
            raise
        except Exception as error:  # whatever a compilation raises (dynamo, inductor, triton, a driver)
            self.give_up(error)
            return instead(*args)

    def give_up(self, error: Exception) -> None:
        self.failure = first_line(error)
        warn(f"{self.failed} ({self.failure}); {self.then}")
