"""The attention kernels are one registry of one signature (model/kernels.py), each layer's chosen once when the model
is built, with its fallback recorded per model (model/fallback.py); and the shared modules of model/ name no scheme:
what a scheme changes in attention comes from its own module, through the generic interfaces of
model/pe/capabilities.py."""

import inspect
import re
from pathlib import Path

import pytest
import torch
from repo_root import REPO

from model import GPT, ModelConfig
from model.fallback import Fallback
from model.kernels import BACKENDS, KERNELS, choose_kernel
from model.pe import SCHEMES

# Registry names that are ordinary words in prose ("no position at all: none", "a learned table", a file's path).
PLAIN_WORDS = {"none", "path", "learned"}


def shared_modules() -> list[Path]:
    """The modules of model/ that every scheme goes through: all but the schemes' own modules in model/pe/."""
    top = sorted((REPO / "model").glob("*.py"))
    return top + [REPO / "model" / "pe" / name for name in ("__init__.py", "base.py", "capabilities.py")]


def scheme_words() -> set[str]:
    """Each scheme's registry name and its module's name, lowercase, without '_' or '-' (so that RoPE, p-RoPE,
    p_rope and stick-breaking are found as rope, prope and stickbreaking)."""
    modules = {path.stem for path in (REPO / "model" / "pe").glob("*.py")} - {"__init__", "base", "capabilities"}
    names = (set(SCHEMES) | modules) - PLAIN_WORDS
    return {re.sub(r"[_-]", "", name.lower()) for name in names}


def mentions(text: str, words: set[str]) -> set[str]:
    tokens = {re.sub(r"[_-]", "", token.lower()) for token in re.findall(r"[A-Za-z0-9][A-Za-z0-9_-]*", text)}
    return tokens & words


def test_the_vocabulary_comes_from_the_registry():
    words = scheme_words()
    assert {"rope", "fox", "stickbreaking", "cope", "alibi", "prope"} <= words and len(words) >= len(SCHEMES) - 2
    assert mentions("FoX's gate, stick-breaking's weights, p-RoPE and model/pe/rope_scaling.py", words) == {
        "fox",
        "stickbreaking",
        "prope",
        "ropescaling",
    }


@pytest.mark.parametrize("path", shared_modules(), ids=lambda path: str(path.relative_to(REPO)))
def test_no_shared_module_of_model_names_a_scheme(path):
    """Code and prose alike: a scheme's mechanism is written in its own module, and attention reads only what the
    generic interfaces hand it (a rotation, a score bias, AttentionMods, a kernel of the registry's signature)."""
    assert mentions(path.read_text(), scheme_words()) == set()


def test_every_kernel_of_the_registry_has_one_signature():
    for name, kernel in KERNELS.items():
        assert list(inspect.signature(kernel).parameters) == ["q", "k", "v", "call"], name
    assert BACKENDS == ("auto", *KERNELS)


def test_a_fallback_warns_once_records_why_and_raises_a_users_mistake(capsys):
    from core.errors import PosGPTError

    fallback, calls = Fallback("X failed", "Y runs from now on"), []

    def broken(n):
        calls.append(n)
        raise RuntimeError("no kernel\nlong log")

    assert [fallback.run(broken, lambda n: -n, n) for n in (1, 2)] == [-1, -2]
    assert calls == [1] and fallback.failure == "RuntimeError: no kernel"
    assert capsys.readouterr().err == "warning: X failed (RuntimeError: no kernel); Y runs from now on\n"

    def refused(n):
        raise PosGPTError("a user's mistake")

    with pytest.raises(PosGPTError):
        Fallback("X failed", "Y").run(refused, lambda n: n, 1)


def test_layers_are_given_their_kernel_once_and_share_the_models_fallback():
    cfg = ModelConfig(n_layer=3, n_head=2, n_embd=16, vocab_size=50, attn_backend="flex")
    model = GPT(cfg, SCHEMES["alibi"].config_class(), train_seq_len=16)
    kernels = model.kernels_on(torch.device("cuda"))
    assert len({id(kernel.fallback) for kernel in kernels}) == 1  # one record for the model's FlexAttention
    assert model.kernels_on(torch.device("cpu"))[0].fallback is not kernels[0].fallback  # one per kind of device
    plain = choose_kernel(SCHEMES["rope"](SCHEMES["rope"].config_class(), model.pe.dims), "sdpa", "cpu")
    assert plain.fallback is None and plain.backend() == "sdpa"  # nothing that may fail: no fallback


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_a_scheme_of_a_new_kind_is_one_module(monkeypatch):
    """docs/adding-a-scheme.md's example, a data-dependent decay handed over as a pair term, defined here and nowhere
    else: every kernel takes it, and decoding from a KV cache equals the full forward."""
    from dataclasses import dataclass

    import torch.nn.functional as F
    from torch import nn

    import model.pe as pe_registry
    from model import KVCache
    from model.pe import PEConfig, PositionalEncoding
    from model.pe.capabilities import AttentionMods, ModifiesAttention, PairTerm

    class DecayTerm(PairTerm):
        def __init__(self, rates):
            self.rates = rates

        def block(self, first, last, k_stop, dtype):
            i = torch.arange(first, last, device=self.rates.device)[:, None]
            j = torch.arange(k_stop, device=self.rates.device)[None, :]
            return (-(i - j) * self.rates[..., first:last, None]).to(dtype)

        def score_mod(self):
            rates = self.rates

            def decayed(score, b, h, q_idx, kv_idx):
                return score - (q_idx - kv_idx) * rates[b, h, q_idx]

            return decayed

    @dataclass
    class DecayConfig(PEConfig):
        name: str = "decay_example"

    class DecayPositionalEncoding(ModifiesAttention, PositionalEncoding):
        config_class = DecayConfig
        modifies = frozenset({"pair_term"})

        def __init__(self, cfg, dims):
            super().__init__(cfg, dims)
            self.weight = nn.Parameter(torch.randn(dims.n_layer, dims.n_head, dims.n_embd) * 0.1)

        def attention_mods(self, x, q, k, layer, cache):
            rates = F.softplus(F.linear(x, self.weight[layer])).transpose(1, 2).float()
            if cache is not None:
                rates = torch.cat((cache.memo.get("rates", rates[..., :0]), rates), dim=-1)
                cache.memo["rates"] = cache.kept(rates, dim=-1)
            return AttentionMods(pair_term=DecayTerm(rates))

    monkeypatch.setitem(pe_registry.SCHEMES, "decay_example", DecayPositionalEncoding)
    idx = torch.randint(0, 50, (2, 20), generator=torch.Generator().manual_seed(0))
    outputs = {}
    for backend in ("sdpa", "math", "flex"):
        torch.manual_seed(0)
        cfg = ModelConfig(n_layer=2, n_head=2, n_embd=16, vocab_size=50, attn_backend=backend)
        model = GPT(cfg, DecayConfig(), train_seq_len=20)
        with torch.no_grad():
            outputs[backend] = model(idx)
            if backend != "flex":
                cache = KVCache()
                steps = [model(idx[:, :12], cache=cache)] + [
                    model(idx[:, t : t + 1], cache=cache) for t in range(12, 20)
                ]
                torch.testing.assert_close(torch.cat(steps, dim=1), outputs[backend], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(outputs["sdpa"], outputs["math"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(outputs["flex"], outputs["math"], rtol=1e-4, atol=1e-5)
    plain = GPT(ModelConfig(n_layer=2, n_head=2, n_embd=16, vocab_size=50), PEConfig(), train_seq_len=20)
    with torch.no_grad():
        assert not torch.allclose(plain(idx), outputs["math"])  # the term changed attention
