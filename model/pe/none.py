"""NoPE: no positional information at all — the control.

A causal decoder can still infer position from the mask itself (Haviv et al. 2022, "Transformer
Language Models without Positional Encodings Still Learn Positional Information"; Kazemnejad et al. 2023),
so this is a meaningful baseline rather than a broken model.
"""

from model.pe.base import PositionalEncoding


class NoPositionalEncoding(PositionalEncoding):
    name = "none"
