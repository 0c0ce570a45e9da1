"""How plots and tables show each positional scheme: its colour in every plot and its name in comparison tables.
Presentation, not mathematics, so it lives with the code that draws (evaluation/plots.py) and tabulates
(reports/): model/pe/ never names a colour. A scheme without an entry, one added later, gets a colour from a hash of
its name (evaluation/plots.py) and its own name in tables, so adding a scheme needs no line here.
"""

from __future__ import annotations

import json
from pathlib import Path

# A table, not code: the names of schemes appear only in model/pe/ and in data (tests/house/test_house_rules.py).
# Tints of a colour for schemes made from another: p-RoPE and the patterns that are mostly RoPE take RoPE's blues, the
# hybrid a light tint of NoPE's purple; "none" is "none (NoPE)" in tables, as "none" alone would read as "no variation".
_TABLE = json.loads((Path(__file__).with_name("schemes.json")).read_text())
COLOURS: dict[str, str] = _TABLE["colours"]  # scheme -> its colour in every plot
DISPLAY_NAMES: dict[str, str] = _TABLE["display_names"]  # scheme -> its name in tables, where not its own


def display_name(name: str) -> str:
    """How comparison tables name scheme ``name``."""
    return DISPLAY_NAMES.get(name, name)
