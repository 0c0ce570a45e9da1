"""Sampling continuations from a GPT with a KV cache (used by sample.py).

The prompt goes through the model once; each later step feeds only the newest token and reuses the keys and
values of every earlier one (model/gpt.py's KVCache), for every positional scheme. The next token is drawn
from the model's distribution at temperature tau, restricted to the top_k most likely tokens:

    p(x_t = v | x_<t)  ∝  exp(z_v / tau)  for v among the top_k largest logits z,  0 otherwise

and tau = 0 means greedy decoding, x_t = argmax_v z_v; so does, in effect, a tau so small that only the largest
logit keeps a probability (next_token computes the formula for every tau > 0 without overflow). Only the real
vocabulary (ids < vocab_size) can be drawn: the embedding's padding rows are never candidates.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from core.errors import PosGPTError
from model.gpt import GPT, KVCache


def check_length(model: GPT, total_tokens: int) -> None:
    """PosGPTError, before anything is generated, when the scheme cannot encode ``total_tokens`` positions."""
    limit = model.pe.max_positions()
    if limit is not None and total_tokens > limit:
        raise PosGPTError(
            f"pe={model.pe.name} encodes at most {limit} positions (its table size), but the prompt and "
            f"sample.max_new_tokens make {total_tokens}: shorten the prompt or lower sample.max_new_tokens"
        )


def next_token(
    logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None = None
) -> torch.Tensor:
    """(B, V) logits -> (B, 1) token ids: argmax when temperature is 0, else a draw as in the module docstring.

    Any temperature > 0 gives a valid distribution: the logits are divided as gaps below the largest one, in
    float64, so no quotient overflows (1e-40 made inf - inf = nan in float32). A temperature so small that every
    other gap underflows to probability 0 is greedy decoding, the limit of the formula (exact ties drawn evenly)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.double()
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    gaps = logits - logits.amax(dim=-1, keepdim=True)  # <= 0: divided by any temperature, never above 0
    return torch.multinomial(torch.softmax(gaps / temperature, dim=-1), 1, generator=generator)


@torch.inference_mode()
def generate(
    model: GPT,
    prompt: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    on_token: Callable[[torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """(B, T) prompt ids -> (B, T + max_new_tokens) ids; ``on_token`` sees each new (B, 1) step (streaming)."""
    check_length(model, prompt.shape[1] + max_new_tokens)
    cache = KVCache()
    out = [prompt]
    logits = model(prompt, cache=cache)[:, -1]
    for step in range(max_new_tokens):
        token = next_token(logits[:, : model.vocab_size], temperature, top_k, generator)
        out.append(token)
        if on_token is not None:
            on_token(token)
        if step + 1 < max_new_tokens:  # the last token's logits are never used
            logits = model(token, cache=cache)[:, -1]
    return torch.cat(out, dim=1)
