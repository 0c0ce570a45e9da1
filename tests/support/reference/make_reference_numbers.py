"""Writes reference_numbers.json: numbers computed by the schemes' reference code, for the tests to compare
posgpt's schemes with (the reference's own numbers, not a transcription of our reading):

- ``rope_scaling``: RoPE frequencies and attention factors (``modeling_rope_utils``),
tests/model/pe/test_rope_scaling.py
  (llama3 and longrope also tests/model/pe/test_rope_scaling_llama3_longrope.py);
- ``p_rope``: p-RoPE's frequencies (``modeling_rope_utils``' "proportional" type, Gemma's p-RoPE: the kept
  frequencies of the full head, zeros for the rest; its ``factor`` divides them, posgpt's ``linear``; Hugging
  Face's config check warns that ``factor`` is an unrecognized key, but the function reads it),
  tests/model/pe/test_p_rope.py;
- ``alibi_slopes``: ALiBi's head slopes (BLOOM's ``build_alibi_tensor``, which follows Press et al.'s
  ``get_slopes``), tests/model/pe/test_alibi.py;
- ``t5_buckets``: T5's relative-position buckets (``T5Attention._relative_position_bucket``, causal),
  tests/model/pe/test_t5.py;
- ``xpos_scores``: xPos attention scores q'_n . k'_m (microsoft/torchscale's ``XPOS``, the paper's code: the
  query scaled up, the key down), tests/model/pe/test_xpos.py.

Not run by the tests (neither package is a dependency of posgpt). To regenerate:

    python -m venv --system-site-packages /tmp/refenv && /tmp/refenv/bin/pip install transformers
    /tmp/refenv/bin/pip install --no-deps torchscale   # only its XPOS module is used, which needs torch alone
    /tmp/refenv/bin/python tests/support/reference/make_reference_numbers.py

Each RoPE case gives posgpt's scaling (type, factor, betas, attention factor), the rotated head dimension d, the
base, the training length L and the current length; ``hf`` is the rope_parameters Hugging Face was called with.
L is Hugging Face's ``original_max_position_embeddings`` (yarn, llama3, longrope) and the current length its
``seq_len`` (longrope switches from ``short_factor`` to ``long_factor`` beyond L).
posgpt's static ``ntk`` has no Hugging Face type of its own: it is Hugging Face's ``dynamic`` with factor 1 at
the length s L, whose base is base (s L / L)^(d / (d - 2)), NTK-aware scaling's base.
"""

import json
from importlib.metadata import version
from pathlib import Path

import torch
import transformers
from torchscale.component.xpos_relative_position import XPOS
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.bloom.modeling_bloom import build_alibi_tensor
from transformers.models.t5.modeling_t5 import T5Attention

# (name, posgpt scaling, rotated dims d, head dim, base, L, current length)
CASES = [
    ("linear, d=64, s=4", dict(type="linear", factor=4.0), 64, 64, 10000.0, 1024, 1024),
    ("ntk, d=64, s=16 (hf: dynamic, factor 1, at 16 L)", dict(type="ntk", factor=16.0), 64, 64, 10000.0, 1024, 1024),
    ("ntk, d=16, s=16 (hf: dynamic, factor 1, at 16 L)", dict(type="ntk", factor=16.0), 16, 16, 10000.0, 64, 64),
    ("dynamic_ntk, d=64, s=4, at L", dict(type="dynamic_ntk", factor=4.0), 64, 64, 10000.0, 1024, 1024),
    ("dynamic_ntk, d=64, s=4, at 3 L", dict(type="dynamic_ntk", factor=4.0), 64, 64, 10000.0, 1024, 3072),
    ("yarn, d=64, L=1024, s=8", dict(type="yarn", factor=8.0), 64, 64, 10000.0, 1024, 1024),
    ("yarn, d=128, base 5e5, L=4096, s=16", dict(type="yarn", factor=16.0), 128, 128, 500000.0, 4096, 4096),
    ("yarn, d=64, L=64, s=16 (model=tiny_wide)", dict(type="yarn", factor=16.0), 64, 64, 10000.0, 64, 64),
    ("yarn, d=16, L=64, s=16 (model=tiny)", dict(type="yarn", factor=16.0), 16, 16, 10000.0, 64, 64),
    (
        "yarn, d=64, L=64, s=16, attention_factor=1",
        dict(type="yarn", factor=16.0, attention_factor=1.0),
        64,
        64,
        10000.0,
        64,
        64,
    ),
    ("yarn, d=64, L=64, s=16, beta_fast=4", dict(type="yarn", factor=16.0, beta_fast=4.0), 64, 64, 10000.0, 64, 64),
    (
        "yarn, d=64, L=512, s=4, beta_fast=16, beta_slow=2",
        dict(type="yarn", factor=4.0, beta_fast=16.0, beta_slow=2.0),
        64,
        64,
        10000.0,
        512,
        512,
    ),
    ("yarn, 32 of 64 dims rotated, L=256, s=8", dict(type="yarn", factor=8.0), 32, 64, 10000.0, 256, 256),
    ("llama3, d=16, L=64, s=16 (model=tiny)", dict(type="llama3", factor=16.0), 16, 16, 10000.0, 64, 64),
    ("llama3, d=64, L=64, s=16 (model=tiny_wide)", dict(type="llama3", factor=16.0), 64, 64, 10000.0, 64, 64),
    (
        "llama3, Llama 3.1: d=128, base 5e5, L=8192, s=8, low 1, high 4",
        dict(type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0),
        128,
        128,
        500000.0,
        8192,
        8192,
    ),
    (
        "llama3, d=64, L=64, s=4, low 2, high 8",
        dict(type="llama3", factor=4.0, low_freq_factor=2.0, high_freq_factor=8.0),
        64,
        64,
        10000.0,
        64,
        64,
    ),
    ("llama3, 32 of 64 dims rotated, L=256, s=8", dict(type="llama3", factor=8.0), 32, 64, 10000.0, 256, 256),
    ("longrope, d=16, L=64, s=16, at L (short)", dict(type="longrope", factor=16.0), 16, 16, 10000.0, 64, 64),
    ("longrope, d=16, L=64, s=16, at 2 L (long)", dict(type="longrope", factor=16.0), 16, 16, 10000.0, 64, 128),
    ("longrope, d=64, L=64, s=16, at L/2 (short)", dict(type="longrope", factor=16.0), 64, 64, 10000.0, 64, 32),
    ("longrope, d=64, L=64, s=16, at 16 L (long)", dict(type="longrope", factor=16.0), 64, 64, 10000.0, 64, 1024),
    (
        "longrope, d=64, L=64, s=16, attention_factor=1, at 4 L",
        dict(type="longrope", factor=16.0, attention_factor=1.0),
        64,
        64,
        10000.0,
        64,
        256,
    ),
    (
        "longrope, d=64, L=64, s=16, attention_factor=1.5, at L",
        dict(type="longrope", factor=16.0, attention_factor=1.5),
        64,
        64,
        10000.0,
        64,
        64,
    ),
    ("longrope, d=64, L=64, s=1, at 2 L", dict(type="longrope", factor=1.0), 64, 64, 10000.0, 64, 128),
    (
        "longrope, Phi-3-like: d=96, L=4096, s=32, at 8 L",
        dict(type="longrope", factor=32.0),
        96,
        96,
        10000.0,
        4096,
        32768,
    ),
]
# p-RoPE: (name, head dim d, p, base, factor)
P_ROPE_CASES = [
    ("d=16, p=0.75", 16, 0.75, 10000.0, 1.0),
    ("d=64, p=0.75", 64, 0.75, 10000.0, 1.0),
    ("d=64, p=0.25", 64, 0.25, 10000.0, 1.0),
    ("d=16, p=0.3 (p d / 2 = 2.4: 2 pairs kept)", 16, 0.3, 10000.0, 1.0),
    ("d=16, p=1 (RoPE)", 16, 1.0, 10000.0, 1.0),
    ("d=128, p=0.75, base 5e5", 128, 0.75, 500000.0, 1.0),
    ("d=64, p=0.75, factor 4 (posgpt: linear:4)", 64, 0.75, 10000.0, 4.0),
]


def longrope_factors(pairs: int, factor: float) -> tuple[list[float], list[float]]:
    """Per-pair factors of the shape LongRoPE's search finds: near 1 for the short ones; for the long ones 1 on the
    fastest pair rising to s on the slowest (geometrically), as interpolation needs."""
    short = [round(1.0 + 0.1 * i / max(pairs - 1, 1), 6) for i in range(pairs)]
    long = [round(factor ** (i / max(pairs - 1, 1)), 6) for i in range(pairs)]
    return short, long


def hf_parameters(scaling: dict, base: float, train_len: int, length: int) -> tuple[dict, int]:
    """Hugging Face's rope_parameters for posgpt's scaling, and the seq_len to call it with."""
    kind = scaling["type"]
    if kind == "ntk":
        return {"rope_type": "dynamic", "rope_theta": base, "factor": 1.0}, int(scaling["factor"] * train_len)
    params = {"rope_type": {"dynamic_ntk": "dynamic"}.get(kind, kind), "rope_theta": base, "factor": scaling["factor"]}
    if kind == "yarn":
        params.update(beta_fast=scaling.get("beta_fast", 32.0), beta_slow=scaling.get("beta_slow", 1.0))
    if kind == "llama3":
        params.update(
            low_freq_factor=scaling.get("low_freq_factor", 1.0), high_freq_factor=scaling.get("high_freq_factor", 4.0)
        )
    if kind == "longrope":
        params.update(short_factor=scaling["short_factor"], long_factor=scaling["long_factor"])
    if kind in ("yarn", "llama3", "longrope"):
        params["original_max_position_embeddings"] = train_len
    if "attention_factor" in scaling:
        params["attention_factor"] = scaling["attention_factor"]
    return params, length


ALIBI_HEADS = [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24, 32]
T5_SETTINGS = [(32, 128), (8, 20)]  # (num_buckets, max_distance)
T5_DISTANCES = 2000  # query - key = 0 .. 1999, and -5 .. -1 (future keys)
XPOS_CASES = [(8, 16, 0), (16, 12, 5000)]  # (head_dim, sequence length, position of its first token)


def rope_scaling_cases() -> list[dict]:
    cases = []
    for name, scaling, rotated, head_dim, base, train_len, length in CASES:
        if scaling["type"] == "longrope":
            scaling = dict(scaling)
            scaling["short_factor"], scaling["long_factor"] = longrope_factors(rotated // 2, scaling["factor"])
        params, seq_len = hf_parameters(scaling, base, train_len, length)
        params["partial_rotary_factor"] = rotated / head_dim
        config = LlamaConfig(
            hidden_size=4 * head_dim,
            num_attention_heads=4,
            head_dim=head_dim,
            max_position_embeddings=train_len,
            rope_parameters=params,
        )
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu", seq_len)
        cases.append(
            dict(
                name=name,
                scaling=scaling,
                rotated_dims=rotated,
                base=base,
                train_len=train_len,
                seq_len=length,
                hf=dict(rope_parameters=params, seq_len=seq_len),
                inv_freq=inv_freq.tolist(),
                attention_factor=float(attention_factor),
            )
        )
    return cases


def p_rope_frequencies() -> list[dict]:
    cases = []
    for name, head_dim, p, base, factor in P_ROPE_CASES:
        params = {"rope_type": "proportional", "rope_theta": base, "factor": factor, "partial_rotary_factor": p}
        config = LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim, rope_parameters=params)
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["proportional"](config, "cpu")
        cases.append(
            dict(
                name=name,
                head_dim=head_dim,
                p=p,
                base=base,
                factor=factor,
                hf=dict(rope_parameters=params),
                inv_freq=inv_freq.tolist(),
                attention_factor=float(attention_factor),
            )
        )
    return cases


def alibi_slopes() -> dict[str, list[float]]:
    """n_head -> slopes: BLOOM's bias at key position 1 is slope x 1."""
    positions = torch.ones(1, 2, dtype=torch.long)
    return {str(n): build_alibi_tensor(positions, n, torch.float64)[:, 0, 1].tolist() for n in ALIBI_HEADS}


def t5_buckets() -> list[dict]:
    relative_position = torch.arange(-T5_DISTANCES + 1, 6)  # key - query: the past, then 5 future keys
    return [
        dict(
            num_buckets=n,
            max_distance=m,
            relative_position=relative_position.tolist(),
            bucket=T5Attention._relative_position_bucket(
                relative_position, bidirectional=False, num_buckets=n, max_distance=m
            ).tolist(),
        )
        for n, m in T5_SETTINGS
    ]


def xpos_scores() -> list[dict]:
    """Random q and k (torchscale's layout: pair i is coordinates 2i, 2i + 1) and their scores q'_n . k'_m."""
    cases = []
    generator = torch.Generator().manual_seed(0)
    for head_dim, length, first in XPOS_CASES:
        q, k = (torch.randn(1, length, head_dim, generator=generator, dtype=torch.float64) for _ in range(2))
        xpos = XPOS(head_dim).double()
        # offset: the sequence's positions are first .. first + length - 1 (torchscale slices the last length)
        rotated_q, rotated_k = xpos(q, offset=first), xpos(k, offset=first, downscale=True)
        cases.append(
            dict(
                head_dim=head_dim,
                first_position=first,
                q=q[0].tolist(),
                k=k[0].tolist(),
                scores=(rotated_q[0] @ rotated_k[0].T).tolist(),
            )
        )
    return cases


def main() -> None:
    out = Path(__file__).with_name("reference_numbers.json")
    document = {
        "versions": {"transformers": transformers.__version__, "torchscale": version("torchscale")},
        "rope_scaling": rope_scaling_cases(),
        "p_rope": p_rope_frequencies(),
        "alibi_slopes": alibi_slopes(),
        "t5_buckets": t5_buckets(),
        "xpos_scores": xpos_scores(),
    }
    out.write_text(json.dumps(document) + "\n")
    print(f"wrote {out} ({document['versions']})")


if __name__ == "__main__":
    main()
