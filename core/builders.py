"""Build the model from a composed config: the one place train.py, eval.py and scripts/ agree on it."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from model import GPT


def build_model(cfg: DictConfig) -> GPT:
    return GPT(OmegaConf.to_object(cfg.model), OmegaConf.to_object(cfg.pe), train_seq_len=cfg.train.seq_len)
