"""Self-Extend, ReRoPE and STRING: RoPE's distances beyond a window remapped at evaluation, without fine-tuning.

RoPE's logit between the query at position i and the key at position j depends on the positions through the
distance i - j only (rope.py). Beyond the training length L the model meets distances it never saw. All three
keep the distance of near pairs, i - j < W (the neighbour window, W < L), and map the distances of far pairs,
i - j >= W, into the trained range, by rotating q and k of far pairs to other positions:

- ``self_extend`` (Jin et al. 2024, "LLM Maybe LongLM: Self-Extend LLM Context Window Without Tuning", sec. 3):
  far pairs use grouped positions, the query at floor(i / G) + W - floor(W / G) and the key at floor(j / G), so
  their distance floor(i / G) - floor(j / G) + W - floor(W / G) grows G times slower than i - j and, for G
  dividing W, equals W at i - j = W: the grouped distances continue the window's. The largest distance at length
  T is about (T - W) / G + W. G is the reference's ``group_size_1``, W its ``group_size_2``.
- ``rerope`` (Su 2023, "Rectified Rotary Position Embeddings", https://kexue.fm/archives/9708): far pairs use the
  distance W itself (the query at position W, the key unrotated at 0): rel(i, j) = min(i - j, W). Leaky ReRoPE
  (``leaky_factor`` k > 1): beyond W the distance grows with slope 1/k, rel(i, j) = W + (i - j - W) / k (the query
  at (i + W (k - 1)) / k, the key at j / k; fractional positions, rotated as any other).
- ``string`` (An et al. 2025, "Why Does the Effective Context Length of LLMs Fall Short?", STRING, sec. 4): far
  pairs are shifted back by W - w (the local window w < W, ``local_window``), the query at i - W + w and the key at
  j, so rel(i, j) = i - j - W + w for i - j >= W: the far distances start again at w, and the largest at length T
  is T - 1 - W + w, so the W - w largest distances, the least trained ones, are never used. The paper uses it
  within a model's own length, to let the well-trained small distances overwrite the rarely trained large ones
  (its reference suggests W = 0.25 to 0.4 L and w = 128 to 512 for L = 128K); beyond L it reaches T = L + W - w
  with trained distances only. W is the reference's ``shifted_offset`` (``diag_size``), w its ``local_value``
  (``local_window``). The reference also multiplies RoPE's cos and sin, for every pair, near and far, by an
  attention factor a = 0.1 ln(s) + 1 with s = 2 (YaRN's temperature at factor 2, "STRING will make the attention
  map smooth, we use the attention_factor to recover it"): a = 1.0693, so every logit q . k grows by a^2 = 1.1434.
  posgpt applies it by default (``attention_factor``, resolved to that number so that result rows record it);
  ``attention_factor=1`` (``string:W:w:1``) switches it off, to tell its effect from the remap's.

Reference code, transcribed in tests/model/pe/test_rope_remap_self_extend.py and
tests/model/pe/test_rope_remap_rerope.py: datamllab/LongLM,
legacy_patch_before_4_38/llama_self_extend_patch.py (``apply_grouped_rotary_pos_emb``: ``position_ids_q =
position_ids//g_size_1 + g_size_2 - g_size_2//g_size_1``, ``position_ids_k = position_ids//g_size_1``; the
neighbour mask ``tril`` less ``tril`` shifted by ``group_size_2``: near iff i - j < W); its newer
self_extend_patch/Llama.py writes the shift ``g_size_2 - g_size_2 / g_size_1`` (float division) when prefilling
and ``//`` when decoding: they agree when G divides W; posgpt uses ``//`` throughout. bojone/rerope,
rerope_patch.py (``query_states2`` rotated at ``position_ids * 0 + window``, ``key_states2`` unrotated,
``rectified_mask = (position_ids[:, -q_len:, None] - position_ids[:, None]).abs() < window``) and
leaky_rerope_patch.py (a linear scaling by ``scaling_factor`` k, query at ``position_ids + offset``, offset = W
(k - 1)). Both of Su's patches also multiply queries by max(1, log(i + 1) / log L) (log-n scaling): that is a
temperature of its own in posgpt, not part of ``rerope``. HKUNLP/STRING, string_for_llama.py (it needs flash-attn
and a CUDA build, so it is transcribed in tests/model/pe/test_rope_remap_string.py, not installed): ``position_ids -
diag_size + local_window`` for the shifted queries, keys at their own positions; its decoding step splits the
cache at kv_seq_len - diag_size (near iff i - j < W), as posgpt does everywhere. Its prefill
(``string_flash_forward``) takes the near part from flash attention with ``window_size=[diag_size, 0]``, which is
inclusive (0 <= i - j <= W), and the shifted part over keys j <= i - W, so it scores the pair at i - j = W twice,
once in each part; posgpt scores it once, shifted (rel = w), as the decoding step does.

The far positions of a pair are a function of the query's position alone and one of the key's alone, so each
token is rotated twice, once as RoPE does (near) and once to its far position: ``RotaryPositionalEncoding.rotate``
returns q and k with both rotations side by side on the last dimension (near, far), and attention takes
q_near . k_near where i - j < W and q_far . k_far beyond (``PositionalEncoding.score_window``,
model/windowed_attention.py). A KV cache keeps both rotations of every key (as the Self-Extend reference's
cache does): twice the key memory, and a new token's step costs what a plain RoPE step costs twice, where Su's
reference caches unrotated keys and rotates all of them again at every generated token.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from core.domain import check_domains, choice, domain
from core.errors import PosGPTError

REMAPS = ("none", "self_extend", "rerope", "string")


@dataclass
class RoPERemapConfig:
    type: str = choice("none", REMAPS)
    window: int | None = domain(None, ge=1)  # W: pairs closer than W keep RoPE's distance; W < train.seq_len
    group: int | None = domain(None, ge=2)  # self_extend only: G, far distances grow G times slower
    leaky_factor: float | None = domain(None, gt=1)  # rerope only: k, far distances grow by 1/k (null: not at all)
    local_window: int | None = domain(None, ge=0)  # string only: w < W, the distance far pairs are shifted back to
    # string only: a, which multiplies cos and sin (logits by a^2); null: the reference's 0.1 ln 2 + 1; 1: none
    attention_factor: float | None = domain(None, gt=0)


# STRING's reference (string_for_llama.py, replace_with_string): attention_factor = 0.1*math.log(2) + 1
STRING_ATTENTION_FACTOR = 0.1 * math.log(2) + 1
# The settings each type takes: required, then optional. Any other is refused.
TYPE_SETTINGS = {
    "none": ((), ()),
    "self_extend": (("group", "window"), ()),
    "rerope": (("window",), ("leaky_factor",)),
    "string": (("window", "local_window"), ("attention_factor",)),
}
# eval.variations notation: self_extend:G:W, rerope:W, rerope:W:k, string:W:w, string:W:w:a (the spec's numbers, in
# this order)
SPEC_FIELDS = {
    "self_extend": ("group", "window"),
    "rerope": ("window", "leaky_factor"),
    "string": ("window", "local_window", "attention_factor"),
}
FLOAT_FIELDS = ("leaky_factor", "attention_factor")
SPEC_FORMS = {
    "self_extend": "self_extend:G:W",
    "rerope": "rerope:W or rerope:W:K",
    "string": "string:W:w or string:W:w:a",
}


def check_remap(remap: RoPERemapConfig, train_len: int | None = None, where: str = "pe.remap") -> None:
    """PosGPTError unless ``remap`` names a known type with the settings it needs (and no other), and a window
    shorter than the training length ``train_len`` (when given): a longer window holds distances never trained."""
    check_domains(remap, f"{where}: ")  # the type among its choices too
    required, optional = TYPE_SETTINGS[remap.type]
    for name in ("window", "group", "leaky_factor", "local_window", "attention_factor"):
        value = getattr(remap, name)
        if value is None and name in required:
            raise PosGPTError(f"{where}: type {remap.type} needs {name} (e.g. {example(remap.type)})")
        if value is not None and name not in required + optional:
            users = [kind for kind, (needed, extra) in TYPE_SETTINGS.items() if name in needed + extra]
            kinds = " and ".join(filter(None, (", ".join(users[:-1]), users[-1])))
            raise PosGPTError(f"{where}: {name} is a setting of type {kinds}, not {remap.type}; drop it")
    if remap.type == "string" and remap.local_window >= remap.window:
        raise PosGPTError(
            f"{where}: local_window={remap.local_window} must be smaller than window={remap.window}: far pairs "
            "(distance >= window) are shifted back to start at local_window (e.g. string:32:4)"
        )
    if train_len is not None and remap.window is not None and remap.window >= train_len:
        raise PosGPTError(
            f"{where}: window={remap.window} must be shorter than the training length {train_len}: within the "
            f"window distances stay as they are, and the model never saw distances of {train_len} or more"
        )


def example(kind: str) -> str:
    return {
        "self_extend": "self_extend:4:32 = group 4, window 32",
        "rerope": "rerope:32 or rerope:32:16",
        "string": "string:32:4 = window 32, local window 4; string:32:4:1 without the attention factor",
    }[kind]


def parse_remap(spec: str) -> RoPERemapConfig | None:
    """``self_extend:4:32`` -> group 4, window 32; ``rerope:32`` (``rerope:32:16``: leaky, k = 16); ``string:32:4``
    -> window 32, local window 4; None when the spec names no remap type (a scaling, rope_scaling.py)."""
    kind, *numbers = [part.strip() for part in str(spec).split(":")]
    if kind not in SPEC_FIELDS:
        return None
    names = SPEC_FIELDS[kind]
    required = TYPE_SETTINGS[kind][0]
    try:
        values = [float(number) if name in FLOAT_FIELDS else int(number) for name, number in zip(names, numbers)]
    except ValueError:
        values = []
    if not len(required) <= len(numbers) <= len(names) or len(values) != len(numbers):
        raise PosGPTError(f"eval.variations: {spec!r} is not {SPEC_FORMS[kind]} ({example(kind)})")
    remap = RoPERemapConfig(type=kind, **dict(zip(names, values)))
    check_remap(remap, where=f"eval.variations entry {spec!r}")
    return resolved(remap)


def resolved(remap: RoPERemapConfig) -> RoPERemapConfig:
    """``remap`` with STRING's attention factor made explicit (null: the reference's), so that what scored a row is
    written in it."""
    if remap.type == "string" and remap.attention_factor is None:
        return dataclasses.replace(remap, attention_factor=STRING_ATTENTION_FACTOR)
    return remap


def remap_attention_factor(remap: RoPERemapConfig) -> float:
    """What the remap multiplies cos and sin by (STRING's attention factor; 1 for the others)."""
    return resolved(remap).attention_factor if remap.type == "string" else 1.0


def remap_label(remap: dict | RoPERemapConfig | None) -> str:
    """``self_extend:4:32``, ``rerope:32``, ``rerope:32:16``, ``string:32:4``: the spec that gives it; "" for none.
    STRING's label names its attention factor only where it is not the reference's: ``string:32:4:1`` without it,
    as rows scored before posgpt applied it hold it (their remap has no ``attention_factor``)."""
    if remap is None:
        return ""
    if isinstance(remap, RoPERemapConfig):
        remap = dataclasses.asdict(remap)
    if remap["type"] == "none":
        return ""
    remap = dict(remap)
    if remap["type"] == "string":
        factor = remap.get("attention_factor", 1.0)
        remap["attention_factor"] = None if factor in (None, STRING_ATTENTION_FACTOR) else factor
    numbers = [remap[name] for name in SPEC_FIELDS[remap["type"]] if remap.get(name) is not None]
    return ":".join([remap["type"], *(f"{number:g}" for number in numbers)])


def far_positions(remap: RoPERemapConfig, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer positions -> (the positions a query there is rotated to for far pairs, those of a key there)."""
    W = remap.window
    if remap.type == "self_extend":
        G = remap.group
        return positions // G + W - W // G, positions // G
    if remap.type == "string":  # the query shifted back by W - w, the key where it is
        return positions - W + remap.local_window, positions
    if remap.leaky_factor is None:
        return torch.full_like(positions, W), torch.zeros_like(positions)
    k = remap.leaky_factor
    positions = positions.to(torch.float64)
    return (positions + W * (k - 1)) / k, positions / k
