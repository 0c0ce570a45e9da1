"""How plots and tables show each positional scheme: its colour in every plot and its name in comparison tables.
Presentation, not mathematics, so it lives with the code that draws (evaluation/plots.py) and tabulates
(reports/): model/pe/ never names a colour. A scheme without an entry, one added later, gets a colour from a hash of
its name (evaluation/plots.py) and its own name in tables, so adding a scheme needs no line here.
"""

from __future__ import annotations

# scheme -> its colour in every plot. Tints of a colour for schemes made from another: p-RoPE and the per-layer
# patterns that are mostly RoPE take RoPE's blues; the hybrid, a light tint of NoPE's purple.
COLOURS: dict[str, str] = {
    "rope": "#1f77b4",
    "alibi": "#ff7f0e",
    "sinusoidal": "#2ca02c",
    "learned": "#d62728",
    "none": "#9467bd",
    "t5": "#8c564b",
    "kerple": "#e377c2",
    "fire": "#7f7f7f",
    "xpos": "#bcbd22",
    "cope": "#17becf",
    "p_rope": "#aec7e8",
    "hybrid": "#c5b0d5",
    "rnope": "#6baed6",
    "llama4_inope": "#08519c",
    "fox": "#98df8a",
    "stickbreaking": "#ff9896",
    "path": "#dbdb8d",
    "pope": "#ffbb78",
}

# scheme -> its name in comparison tables, where it is not the scheme's own ("none" alone would read as "no
# variation").
DISPLAY_NAMES: dict[str, str] = {
    "none": "none (NoPE)",
    "fox": "FoX",
    "stickbreaking": "stick-breaking",
    "path": "PaTH",
    "pope": "PoPE",
}


def display_name(name: str) -> str:
    """How comparison tables name scheme ``name``."""
    return DISPLAY_NAMES.get(name, name)
