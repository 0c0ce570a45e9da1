"""T5 relative position buckets, causal (Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a
Unified Text-to-Text Transformer", sec. 2.1).

Each head learns one scalar per bucket of query-key distance, shared by all layers:

    score(i, j) = q_i . k_j / sqrt(d) + w[bucket(i - j), h]

With n = max(i - j, 0), B = num_buckets and e = B / 2 (exact buckets), D = max_distance:

    bucket(n) = n                                                   if n < e
              = min(B - 1, e + floor(ln(n / e) / ln(D / e) * (B - e)))   otherwise

so nearby distances get a bucket each and far ones share logarithmically wider buckets; every distance
>= D lands in the last bucket, which is why T5 runs at any length. Reference: Hugging Face transformers'
``T5Attention._relative_position_bucket`` with ``bidirectional=False`` (its relative_position is j - i).

The table is initialised N(0, n_embd^-1/2) as in Hugging Face's T5 and is not weight-decayed (it holds
biases, not weights).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from core.domain import domain
from core.errors import PosGPTError
from model.pe.base import ModelDims, PEConfig, PositionalEncoding
from model.pe.capabilities import DistanceBias


@dataclass
class T5Config(PEConfig):
    name: str = "t5"
    num_buckets: int = domain(32, ge=2)  # B: the first B/2 distances exact, the rest in log-spaced buckets
    max_distance: int = domain(128, ge=2)  # D: distances >= D share the last bucket


def t5_bucket(distance: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Integer distances i - j (negative ones count as 0) -> bucket indices in [0, num_buckets)."""
    n = distance.clamp(min=0)
    exact = num_buckets // 2
    # n / exact >= 1 where the log is used; clamping keeps the unused branch finite for n < exact.
    log_ratio = torch.log(n.clamp(min=exact).float() / exact) / math.log(max_distance / exact)
    far = (exact + (log_ratio * (num_buckets - exact)).long()).clamp(max=num_buckets - 1)
    return torch.where(n < exact, n, far)


class T5PositionalEncoding(DistanceBias, PositionalEncoding):
    name = "t5"
    config_class = T5Config

    def __init__(self, cfg: T5Config, dims: ModelDims) -> None:
        super().__init__(cfg, dims)
        if cfg.max_distance <= cfg.num_buckets // 2:
            raise PosGPTError(
                f"pe=t5 needs max_distance > num_buckets/2 (got pe.max_distance={cfg.max_distance}, "
                f"pe.num_buckets={cfg.num_buckets})"
            )
        self.table = nn.Parameter(torch.randn(cfg.num_buckets, dims.n_head) * dims.n_embd**-0.5)

    def no_weight_decay(self) -> list[nn.Parameter]:
        return [self.table]

    def score_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, head: torch.Tensor, layer: int) -> torch.Tensor:
        return self.table[t5_bucket(q_pos - k_pos, self.cfg.num_buckets, self.cfg.max_distance), head]
