"""Fixed sinusoidal position vectors added to the token embeddings (Vaswani et al. 2017, §3.5).

    PE(pos, 2i)   = sin(pos / 10000^(2i/d))
    PE(pos, 2i+1) = cos(pos / 10000^(2i/d))

Defined for every position, so evaluation at any length runs (whether the model *uses* it well is the
question posgpt measures).

Scale. The raw vectors have entries in [-1, 1] (RMS 1/sqrt(2)), while GPT-2 initialises token embeddings
with std 0.02: added as-is, position swamps the token signal by ~35x and training stalls (measured: ppl
~825 vs ~330 for the other schemes after 300 steps of the tiny model). Vaswani et al. multiply token
embeddings by sqrt(d), but that assumes unit-variance embeddings; with std 0.02 and d=64 position would
still dominate 4x. posgpt instead multiplies the sinusoid by ``scale``; by default (``scale: null``) the
scale that gives it the same RMS as the token embedding at initialisation (``init_std * sqrt(2)``), i.e.
the same starting magnitude as the learned table it is compared with. Set ``pe.scale=1.0`` for the paper's
unscaled vectors. Measured trade-off (README, Results): scaled, the tiny model trains as well as NoPE and
extrapolates like it (ppl 25.9 at 1x, 27.1 at 16x); unscaled, ppl 70 at 1x and the literature's failure
past the training length (307 at 8x).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from model.pe.base import ModelDims, PEConfig, PositionalEncoding


@dataclass
class SinusoidalConfig(PEConfig):
    name: str = "sinusoidal"
    base: float = 10000.0
    scale: float | None = None  # None: match the token embedding's init RMS (see module docstring)


def sinusoid_table(positions: torch.Tensor, dim: int, base: float = 10000.0) -> torch.Tensor:
    """(T,) positions -> (T, dim) with sin in even and cos in odd columns, exactly the paper's formula."""
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device) / dim)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # pos / base^(2i/d)
    table = torch.empty(positions.numel(), dim, dtype=torch.float64, device=positions.device)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)
    return table


class SinusoidalPositionalEncoding(PositionalEncoding):
    name = "sinusoidal"
    config_class = SinusoidalConfig

    def __init__(self, cfg: SinusoidalConfig, dims: ModelDims) -> None:
        super().__init__(cfg, dims)
        self.scale = cfg.scale if cfg.scale is not None else dims.init_std * math.sqrt(2.0)

    def embed(self, positions: torch.Tensor) -> torch.Tensor:
        # Computed in float64 on the fly (T x d values: cheap next to attention): accurate at any position,
        # and nothing to store in checkpoints.
        return (sinusoid_table(positions, self.dims.n_embd, self.cfg.base) * self.scale).float()
