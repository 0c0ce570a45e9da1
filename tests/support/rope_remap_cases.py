"""What tests/model/pe/test_rope_remap_self_extend.py and tests/model/pe/test_rope_remap_rerope.py share: RoPE written
out from its formula, the
references' attention (two score matrices merged by a mask, then softmax), and posgpt's scheme run through
attention, on one small case."""

from __future__ import annotations

import math

import torch

from model.kernels import attend
from model.pe import ModelDims, PositionState
from model.pe.rope import RoPEConfig, RotaryPositionalEncoding
from model.pe.rope_remap import RoPERemapConfig

BASE = 10000.0
HEAD_DIM = 8
TRAIN_LEN = 64


def rope_at(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x (..., T, d) rotated to ``positions`` (T,), float: pair (i, i + d/2) turned by position * base^(-2i/d)."""
    d = x.shape[-1]
    theta = BASE ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = positions.to(torch.float64)[:, None] * theta  # (T, d/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    first, second = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


def merged_attention(near: torch.Tensor, far: torch.Tensor, use_near: torch.Tensor, v: torch.Tensor):
    """The references' last steps: where(use_near, near scores, far scores), the causal mask, softmax, @ v.
    Returns (output, probabilities)."""
    T = near.shape[-1]
    scores = torch.where(use_near, near, far).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)  # "upcast attention to fp32", as the references
    return probs @ v, probs


def scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def scheme(remap: RoPERemapConfig, train_len: int = TRAIN_LEN) -> RotaryPositionalEncoding:
    dims = ModelDims(n_embd=2 * HEAD_DIM, n_head=2, head_dim=HEAD_DIM, train_seq_len=train_len, init_std=0.02)
    return RotaryPositionalEncoding(RoPEConfig(remap=remap), dims)


def qkv(T: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(1, 2, T, HEAD_DIM) each, float32 (attention's softmax runs in float32, as the references' does)."""
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, T, HEAD_DIM, generator=generator) for _ in range(3))


def posgpt_attention(pe, q, k, v, backend: str = "sdpa", positions: torch.Tensor | None = None):
    """The scheme's rotate, then model/attention.py's attend: (output, probabilities from the capture path)."""
    T = q.shape[-2]
    explicit = positions is not None
    positions = torch.arange(T) if positions is None else positions
    state = PositionState(positions, positions, 0, pe.prepare(positions, T, {}), explicit=explicit)
    q2, k2 = pe.rotate(q, k, positions, T, state.prepared)
    probs = []
    attend(q2, k2, v, pe, backend, state, capture=probs)
    return attend(q2, k2, v, pe, backend, state), probs[0]


def pairwise_attention(q, k, v, positions: torch.Tensor, distance) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention written pair by pair from a formula for the distance RoPE sees, ``distance(i, j)`` of the positions
    (query i, key j): q_i rotated by that distance against the unrotated k_j (RoPE's logit depends on the two
    positions through their difference only). (output, probabilities)."""
    T = q.shape[-2]
    logits = torch.full((*q.shape[:-2], T, T), float("-inf"), dtype=q.dtype)
    for a in range(T):
        for b in range(a + 1):
            rotated = rope_at(q[..., a : a + 1, :], torch.tensor([distance(int(positions[a]), int(positions[b]))]))
            logits[..., a, b] = (rotated[..., 0, :] * k[..., b, :]).sum(-1) / math.sqrt(q.shape[-1])
    probs = torch.softmax(logits, dim=-1)
    return probs @ v, probs


def tiny_model(remap: RoPERemapConfig | None = None, train_len: int = 16):
    """A 2-layer GPT with RoPE (random weights), evaluated as given: what attention computes does not need training."""
    from model import GPT
    from model.gpt import ModelConfig

    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=2, n_embd=32, n_head=2, vocab_size=128), RoPEConfig(), train_seq_len=train_len)
    if remap is not None:
        model.pe.set_remap(remap)
    return model.eval()


@torch.no_grad()
def cached_logits(model, tokens: torch.Tensor, prompt: int) -> torch.Tensor:
    """The logits of ``tokens`` computed as sample.py does: the prompt at once, then one token at a time."""
    from model.gpt import KVCache

    cache = KVCache()
    steps = [model(tokens[:, :prompt], cache=cache)]
    steps += [model(tokens[:, t : t + 1], cache=cache) for t in range(prompt, tokens.shape[1])]
    return torch.cat(steps, dim=1)
