"""The evaluation protocols' cases (tests/evaluation/test_extrapolation.py, tests/evaluation/test_key_tokens.py): a
token array in memory, a tiny model, and the brute-force score of every target from an explicit window."""

import numpy as np
import torch
import torch.nn.functional as F

from model import GPT, ModelConfig
from model.pe import SCHEMES

VOCAB = 300
TRAIN_LEN = 8


class Tokens:
    """The TokenArray interface (len, read) over an in-memory array."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.data = np.random.default_rng(seed).integers(0, VOCAB, n).astype(np.uint16)

    def __len__(self) -> int:
        return len(self.data)

    def read(self, start: int, length: int) -> np.ndarray:
        assert 0 <= start and start + length <= len(self.data)
        return self.data[start : start + length].copy()


def tiny(name: str = "rope") -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=16, vocab_size=VOCAB, attn_backend="sdpa")
    return GPT(cfg, SCHEMES[name].config_class(), train_seq_len=TRAIN_LEN).eval()


def brute_force(model, tokens, pairs):
    """Loss of predicting each target t from the n tokens [t - n, t), one full forward per (t, n).

    The softmax runs over the real vocabulary: the model's logits, padding rows excluded.
    """
    losses = []
    for t, n in pairs:
        x = torch.from_numpy(tokens.read(t - n, n).astype(np.int64))[None]
        logits = model(x)[0, -1]
        losses.append(F.cross_entropy(logits[None], torch.tensor([int(tokens.data[t])])).item())
    return losses
