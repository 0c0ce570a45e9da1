"""The one interface every positional scheme implements.

Position can enter a transformer in exactly three places. A scheme overrides the hooks it uses and
inherits no-ops for the rest:

1. ``embed(positions)``      -> a vector per position, added to the token embeddings (sinusoidal, learned)
2. ``rotate(q, k, positions, seq_len)`` -> q and k transformed inside every attention layer (RoPE and its variants)
3. ``score_bias(q_pos, k_pos, head)`` -> a term added to attention scores (ALiBi, T5 buckets, FIRE, ...)

``score_bias`` is written once as an elementwise function of broadcastable integer tensors. The attention
code turns it into a FlexAttention ``score_mod`` on GPU (scalar tensors per score) or a materialised bias
block on CPU (q_pos of shape (Tq, 1), k_pos of shape (1, Tk), head of shape (H, 1, 1)); the scheme never
knows which.

Each scheme is a module in ``model/pe/`` that defines a subclass with ``name`` set and a config dataclass
(subclass of :class:`PEConfig`) in ``config_class``; ``model/pe/__init__.py`` discovers it, so adding a
scheme is one module plus one ``configs/pe/<name>.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn


@dataclass
class PEConfig:
    """Parameters common to all schemes; a scheme's own dataclass adds its fields."""

    name: str = "none"


@dataclass(frozen=True)
class ModelDims:
    """What a scheme needs to know about the model it sits in."""

    n_embd: int
    n_head: int
    head_dim: int
    train_seq_len: int  # the context length the model is (or was) trained at
    init_std: float  # std of the token embedding at initialisation


class PositionalEncoding(nn.Module):
    """Base class: no position at all. Subclasses override the hooks they use."""

    name: ClassVar[str] = ""
    config_class: ClassVar[type[PEConfig]] = PEConfig
    # True when score_bias is overridden: attention must then use a path that can add a bias.
    has_score_bias: ClassVar[bool] = False

    def __init__(self, cfg: PEConfig, dims: ModelDims) -> None:
        super().__init__()
        self.cfg = cfg
        self.dims = dims

    def max_positions(self) -> int | None:
        """The longest sequence this scheme can encode, or None when it is defined for any length."""
        return None

    def embed(self, positions: torch.Tensor) -> torch.Tensor | None:
        """(T,) integer positions -> (T, n_embd) vectors added to the token embeddings, or None."""
        return None

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, seq_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Transform the new q and k, both (B, H, T, D), at integer positions (T,).

        ``seq_len`` is the number of keys attended to (cached ones included), for schemes that adapt to it.
        """
        return q, k

    def rotation_depends_on_length(self) -> bool:
        """True when ``rotate`` depends on ``seq_len`` (dynamic NTK): a KV cache then keeps keys unrotated."""
        return False

    def score_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        """A term added to the (pre-softmax, already scaled) attention score; elementwise, broadcastable."""
        raise NotImplementedError(f"positional scheme {self.name!r} has no score bias")

    def extra_repr(self) -> str:
        return f"name={self.name!r}"
