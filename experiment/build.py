"""Build the model from a composed config, and count its FLOPs: the one place train.py, eval.py and scripts/
agree on them."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf
from torch import nn

from core.runtime import flops_per_token
from model import GPT


def build_model(cfg: DictConfig) -> GPT:
    return GPT(OmegaConf.to_object(cfg.model), OmegaConf.to_object(cfg.pe), train_seq_len=cfg.train.seq_len)


def model_flops_per_token(model: GPT, seq_len: int) -> float:
    """:func:`core.runtime.flops_per_token` of a posgpt GPT trained at ``seq_len``; N leaves out the scheme's
    lookup tables (a learned position table is read, not multiplied). Used for MFU by training and bench."""
    lookups = sum(m.weight.numel() for m in model.pe.modules() if isinstance(m, nn.Embedding))
    return flops_per_token(model.num_params() - lookups, model.cfg.n_layer, model.cfg.n_embd, seq_len)
