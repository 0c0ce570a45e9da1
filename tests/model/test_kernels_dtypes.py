"""Every scheme runs in float32 and in float64, on every attention path it takes on a CPU, and agrees across them.

Each ``configs/pe/<name>.yaml`` is built as a user's ``pe=<name>`` builds it (so the per-layer presets are covered
with the plain schemes, and a scheme or preset added later is too), its zero-initialised tables filled so that no
position signal is hidden, then run on every backend in float32 and, the same weights cast, in float64. The float64
logits must agree with the float32 ones to float32's tolerance: a scheme that casts to float32 on the way (a
``.float()`` on its distances) fails with a dtype error, and one that computes something else in float64 fails the
comparison. Backends that resolve to the same path for a scheme are run once; each path also decodes from a KV
cache (queries after the first key take the blockwise path), and RoPE's remaps take the written-out windowed path.
"""

import pytest
import torch
from omegaconf import OmegaConf
from repo_root import REPO

from experiment.compose import compose_config
from model import GPT, KVCache, ModelConfig
from model.kernels import resolve_layer_backends

PRESETS = sorted(path.stem for path in (REPO / "configs" / "pe").glob("*.yaml"))
BACKENDS = ("sdpa", "math", "flex")  # flex: FlexAttention forward, eager, on a CPU
VOCAB, T = 97, 24
# float32's rounding in a 4-layer model's logits, accumulated: ~1e-6 relative, so 1e-4 leaves room and still catches
# a scheme computing another function in float64 (those differ by 1e-2 or more)
FLOAT32_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
# slow: 25 cases, each on every path it takes, with eager FlexAttention among them (~20 s); the fast loop leaves it
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")]


# RoPE's distances remapped beyond a window (model/windowed_attention.py), each at a window below T
REMAPS = {
    "self_extend": ["pe.remap.type=self_extend", "pe.remap.group=4", "pe.remap.window=8"],
    "rerope": ["pe.remap.type=rerope", "pe.remap.window=8", "pe.remap.leaky_factor=4"],
    "string": ["pe.remap.type=string", "pe.remap.window=8", "pe.remap.local_window=2"],
}
CASES = [*PRESETS, *(f"rope+{remap}" for remap in REMAPS)]


def preset_config(case: str):
    """The pe config ``pe=<name>`` (and a remap, for ``rope+<remap>``) composes, as a dataclass."""
    name, _, remap = case.partition("+")
    return OmegaConf.to_object(compose_config([f"pe={name}", *REMAPS.get(remap, [])]).pe)


def build(case: str, backend: str) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=4, n_head=4, n_embd=32, vocab_size=VOCAB, attn_backend=backend)
    model = GPT(cfg, preset_config(case), train_seq_len=T).eval()
    with torch.no_grad():  # zero-initialised tables (CoPE, T5) would hide a position path
        generator = torch.Generator().manual_seed(1)
        for parameter in model.parameters():
            if not parameter.any():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return model


def paths(case: str) -> dict[str, str]:
    """Each distinct path the scheme's layers take on a CPU -> one backend that asks for it."""
    model = build(case, "math")
    found: dict[str, str] = {}
    for backend in BACKENDS:
        found.setdefault(resolve_layer_backends(backend, model.pe, torch.device("cpu")), backend)
    return found


def test_every_yaml_is_covered():
    assert {"rope", "alibi", "fire", "hybrid", "rnope", "llama4_inope"} <= set(PRESETS)


def decoded(model: GPT, tokens: torch.Tensor, prompt: int) -> torch.Tensor:
    """The logits of the tokens after ``prompt``, each from a KV cache holding every token before it."""
    cache = KVCache()
    model(tokens[:, :prompt], cache=cache)
    return torch.cat([model(tokens[:, t : t + 1], cache=cache) for t in range(prompt, tokens.shape[1])], dim=1)


@pytest.mark.parametrize("case", CASES)
@torch.no_grad()
def test_float64_agrees_with_float32_on_every_path(case):
    tokens = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(0))
    for path, backend in paths(case).items():
        model = build(case, backend)
        single, single_decoded = model(tokens), decoded(model, tokens, T - 2)
        model.double()
        double, double_decoded = model(tokens), decoded(model, tokens, T - 2)
        where = f"{case} on {path}"
        assert single.dtype == torch.float32 and double.dtype == double_decoded.dtype == torch.float64, where
        for got, want in ((double, single), (double_decoded, single_decoded)):
            torch.testing.assert_close(got.float(), want, **FLOAT32_TOLERANCE, msg=f"{where}: float64 != float32")
        torch.testing.assert_close(double_decoded, double[:, -2:], msg=f"{where}: decoding != one forward pass")
