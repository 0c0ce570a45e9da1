"""Fixed sinusoidal position vectors added to the token embeddings (Vaswani et al. 2017, sec. 3.5).

    PE(pos, 2i)   = sin(pos / 10000^(2i/d))
    PE(pos, 2i+1) = cos(pos / 10000^(2i/d))
    x_t = s_tok W_tok[token_t] + scale PE(t)      (s_tok: the token multiplier of model.embedding, model/gpt.py)

Defined for every position, so evaluation at any length runs (whether the model *uses* it well is the
question posgpt measures).

Scale. By default (``scale: 1.0``) the vectors are added unscaled, as in the paper and in fairseq's
``SinusoidalPositionalEmbedding`` (fairseq/modules/sinusoidal_positional_embedding.py), the scheme Press et
al. 2022 compared against. That is balanced under the token-embedding convention the paper and fairseq use
(``model.embedding=fairseq``, model/gpt.py): tokens start N(0, d^-1/2) and are multiplied by sqrt(d), so both
signals start at RMS ~1 (the sinusoid's is 1/sqrt(2)). fairseq's table is the tensor2tensor variant ([sin | cos]
halves, frequencies 10000^(-i/(d/2 - 1))); posgpt keeps the paper's interleaved formula above.

Under GPT-2's convention (``model.embedding=gpt2``: tokens N(0, 0.02), no multiplier) the unscaled sinusoid
swamps the tokens ~35x. posgpt's remedy for that case, not a scheme from the literature: the sinusoid scaled to
the token signal's RMS at initialisation (``token_rms * sqrt(2)``), the starting magnitude a learned table has.
``scale: null`` asks for it under either convention; ``match_tokens: true`` (the default) applies it under
GPT-2's convention only, so that ``scale`` keeps the paper's vectors under fairseq's and the task configs
(configs/task/, which choose GPT-2's convention) get a sinusoid they can learn with, for every scheme alike.
(Checkpoints written before ``match_tokens`` existed build with false, as they were trained.)
Measured (docs/results.md): under GPT-2's convention on text the remedy trains like NoPE and extrapolates like
NoPE; the literature's pattern (close to RoPE at 1x, worse past it) needs the unscaled sinusoid under
fairseq's convention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from core.domain import domain
from model.pe.base import ModelDims, PEConfig, PositionalEncoding
from model.pe.capabilities import PositionEmbedding


@dataclass
class SinusoidalConfig(PEConfig):
    name: str = "sinusoidal"
    base: float = domain(10000.0, gt=1)  # wavelength base
    # 1.0: the paper's vectors; null: match the token signal's init RMS (see above)
    scale: float | None = domain(1.0, gt=0)
    # true: under GPT-2's unscaled token convention, match the token signal's RMS whatever ``scale`` says.
    # (Checkpoints written before this key existed get false, what they did: experiment/settings.py.)
    match_tokens: bool = True


def _matched(cfg: SinusoidalConfig, dims: ModelDims) -> bool:
    """Whether match_tokens scales the sinusoid to the tokens: under GPT-2's convention, whose multiplier is 1."""
    return cfg.match_tokens and dims.token_scale == 1.0


def sinusoid_table(positions: torch.Tensor, dim: int, base: float = 10000.0) -> torch.Tensor:
    """(T,) positions -> (T, dim) with sin in even and cos in odd columns, exactly the paper's formula."""
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device) / dim)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # pos / base^(2i/d)
    table = torch.empty(positions.numel(), dim, dtype=torch.float64, device=positions.device)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)
    return table


class SinusoidalPositionalEncoding(PositionEmbedding, PositionalEncoding):
    name = "sinusoidal"
    config_class = SinusoidalConfig

    def __init__(self, cfg: SinusoidalConfig, dims: ModelDims) -> None:
        super().__init__(cfg, dims)
        # The table's entries have RMS 1/sqrt(2): sqrt(2) * token_rms gives it the token signal's RMS.
        match = cfg.scale is None or _matched(cfg, dims)
        self.scale = dims.token_rms * math.sqrt(2.0) if match else cfg.scale

    @classmethod
    def unread_settings(cls, cfg: SinusoidalConfig, dims: ModelDims) -> list[tuple[str, str]]:
        """A scale other than the paper's under match_tokens and GPT-2's convention: the sinusoid is matched to the
        tokens whatever it says (null asks for that same match, so it is read)."""
        if not _matched(cfg, dims) or cfg.scale is None or cfg.scale == SinusoidalConfig.scale:
            return []
        return [
            (
                "scale",
                f"pe.scale={cfg.scale} is not read under pe.match_tokens=true with model.embedding=gpt2 (the "
                "sinusoid is scaled to the token signal's RMS): drop pe.scale, or set pe.match_tokens=false",
            )
        ]

    def embed(self, positions: torch.Tensor) -> torch.Tensor:
        # Computed in float64 on the fly (T x d values: cheap next to attention): accurate at any position,
        # and nothing to store in checkpoints.
        return (sinusoid_table(positions, self.dims.n_embd, self.cfg.base) * self.scale).float()
