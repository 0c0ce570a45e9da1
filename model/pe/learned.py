"""A trainable table of position vectors added to the token embeddings (GPT-2; Radford et al. 2019).

    x_t = s_tok W_tok[token_t] + W_pos[t],   W_pos in R^(max_positions x d)

s_tok and the initialisation follow ``model.embedding`` (model/gpt.py): under ``fairseq`` s_tok = sqrt(d) and
the table starts N(0, d^-1/2), as fairseq's ``PositionalEmbedding(learned=True)`` initialises it
(fairseq/modules/positional_embedding.py); under ``gpt2`` s_tok = 1 and the table starts N(0, model.init_std),
like GPT-2's token table.

The table has rows only for positions seen in training, so it cannot encode position >= max_positions:
the model raises a clear error naming the table size (evaluation reports such lengths as not evaluable).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from core.domain import domain
from core.errors import PosGPTError
from model.pe.base import ModelDims, PEConfig, PositionalEncoding
from model.pe.capabilities import PositionEmbedding


@dataclass
class LearnedConfig(PEConfig):
    name: str = "learned"
    max_positions: int | None = domain(None, ge=1)  # None: the training sequence length


class LearnedPositionalEncoding(PositionEmbedding, PositionalEncoding):
    name = "learned"
    config_class = LearnedConfig

    def __init__(self, cfg: LearnedConfig, dims: ModelDims) -> None:
        super().__init__(cfg, dims)
        n_positions = cfg.max_positions or dims.train_seq_len
        self.table = nn.Embedding(n_positions, dims.n_embd)
        nn.init.normal_(self.table.weight, mean=0.0, std=dims.embedding_std)

    @classmethod
    def check_model(cls, cfg: LearnedConfig, dims: ModelDims) -> None:
        """The table holds a vector for every position of a training window (past it, a window's positions are
        train.random_positions' or PoSE's, which the training planner checks against max_positions())."""
        if cfg.max_positions is not None and cfg.max_positions < dims.train_seq_len:
            raise PosGPTError(
                f"pe.max_positions={cfg.max_positions} is shorter than train.seq_len={dims.train_seq_len}: the table "
                "has no vector for the positions past it; raise pe.max_positions (or drop it: null is train.seq_len)"
            )

    def max_positions(self) -> int:
        return self.table.num_embeddings

    def embed(self, positions: torch.Tensor) -> torch.Tensor:
        # The model checks lengths against max_positions() before calling (on the host, without a sync).
        return self.table(positions)
