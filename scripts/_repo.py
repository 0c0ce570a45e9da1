"""Puts the repository root on ``sys.path``, so ``python scripts/<name>.py`` can import posgpt's packages.

Each script imports this module first (``import _repo``: the script's own folder is on the path already); it then
imports core.interrupts, so that Ctrl-C while the script's libraries import is one line, exit 130.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import core.interrupts  # noqa: E402,F401 (after the path is set: its effect is the point)
