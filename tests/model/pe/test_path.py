"""PaTH attention (model/pe/path.py) against flash-linear-attention's naive PyTorch reference, ``naive_path_attn`` of
``fla/ops/path_attn/naive.py`` (PyPI ``fla-core``, a test-only dependency, requirements-dev.txt), on the same seeded
random q, k, v, w, beta and gate: outputs and the gradients of all six, at lengths that are not whole chunks, with and
without the forget gate. ``fla/ops/__init__.py`` imports every Triton kernel of the package, which a CPU-only machine
cannot import, so the test loads that one file by its path (it imports torch and einops).

Also: the equation with explicit D x D products at tiny sizes over several chunks, the keys the KV cache keeps, cached
decoding and sampling through the model, the written-out path on every backend and device, randomized positions
refused, and a training step.

The reference computes in float32 whatever its inputs: against it within 1e-4 (its chunked products and ours round
differently; a wrong transition is off by O(1)). Our float64 against the explicit products within 1e-10.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from fla_naive import naive_reference

import model.pe.path as path_module
from core.errors import PosGPTError
from model import GPT, KVCache, ModelConfig
from model.kernels import attend
from model.pe import SCHEMES, ModelDims
from model.pe.capabilities import AttentionMods
from model.pe.fox import CumulativeTerm
from model.pe.path import PaTHConfig
from model.sampling import generate

B, H, D = 2, 3, 8
DIMS = ModelDims(n_embd=H * D, n_head=H, head_dim=D, train_seq_len=16, init_std=0.02, n_layer=2)
FLOAT64 = {"rtol": 1e-10, "atol": 1e-10}
AGAINST_REFERENCE = {"rtol": 1e-4, "atol": 1e-4}


naive_path_attn = naive_reference("path_attn", "naive_path_attn")


def scheme(**settings):
    return SCHEMES["path"](PaTHConfig(**settings), DIMS)


def inputs(T: int, seed: int = 0, dtype=torch.float32) -> list[torch.Tensor]:
    """q, k, v, unit w (B, H, T, D), beta in (0, 2) and log forget gates (B, H, T), all needing gradients."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v, w = (torch.randn(B, H, T, D, generator=generator, dtype=torch.float64) for _ in range(4))
    beta = 2 * torch.rand(B, H, T, generator=generator, dtype=torch.float64)
    gate = F.logsigmoid(torch.randn(B, H, T, generator=generator, dtype=torch.float64) + 2)
    tensors = [q, k, v, F.normalize(w, dim=-1), beta, gate]
    return [t.to(dtype).requires_grad_() for t in tensors]


def ours(q, k, v, w, beta, gate=None) -> torch.Tensor:
    """The scheme's logits through attention's written-out path; the gate as PaTH-FoX's cumulative bias, divided by
    sqrt(d) (what ``cumulative_bias`` returns)."""
    logits = scheme().transported_scores(q, k, (w, beta), carry=False)[0]
    term = None if gate is None else CumulativeTerm((gate / math.sqrt(D)).cumsum(-1))
    return attend(q, k, v, scheme(), "auto", mods=AttentionMods(pair_term=term, logits=logits))


def reference(q, k, v, w, beta, gate=None) -> torch.Tensor:
    """fla's naive reference, whose layout is (B, T, H, D), back in (B, H, T, D); zeros for no gate."""
    gate = torch.zeros_like(beta) if gate is None else gate
    layout = [t.transpose(1, 2) for t in (q, k, v, w, beta, gate)]
    return naive_path_attn(*layout, scale=D**-0.5).transpose(1, 2)


def outputs_and_grads(out: torch.Tensor, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The output and the gradients of ``tensors`` through a fixed random projection of it."""
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)
    return [out.detach(), *torch.autograd.grad((out * weights).sum(), tensors)]


@pytest.mark.parametrize("gate", [False, True], ids=["path", "path-fox"])
@pytest.mark.parametrize("T", [37, 150])
def test_equals_the_naive_reference_forward_and_backward(T, gate):
    """37 tokens (one chunk, not a whole one) and 150 (three chunks, the last cut short): the output and the gradients
    of q, k, v, w, beta (and the gate)."""
    q, k, v, w, beta, g = inputs(T)
    tensors = [q, k, v, w, beta] + ([g] if gate else [])
    got = outputs_and_grads(ours(*tensors), tensors)
    want = outputs_and_grads(reference(*tensors), tensors)
    for name, a, b in zip(["output", "q", "k", "v", "w", "beta", "gate"], got, want):
        torch.testing.assert_close(a, b, msg=lambda m, name=name: f"{name}: {m}", **AGAINST_REFERENCE)


def by_products(q, k, w, beta) -> torch.Tensor:
    """A_ij = q_i^T H_i ... H_{j+1} k_j with H_t = I - beta_t w_t w_t^T as explicit D x D matrices, one head, float64;
    zero above the diagonal."""
    T, d = q.shape
    logits = torch.zeros(T, T, dtype=torch.float64)
    for i in range(T):
        product = torch.eye(d, dtype=torch.float64)
        for j in range(i, -1, -1):
            logits[i, j] = q[i] @ product @ k[j]
            product = product @ (torch.eye(d, dtype=torch.float64) - beta[j] * torch.outer(w[j], w[j]))
    return logits


@torch.no_grad()
def test_the_equation_as_explicit_products_over_several_chunks(monkeypatch):
    """Chunks of 3 tokens over 11 (four chunks, the last of two), float64: every causal logit, and the keys carried
    through every later transition."""
    monkeypatch.setattr(path_module, "CHUNK", 3)
    q, k, _, w, beta, _ = (t.detach() for t in inputs(11, dtype=torch.float64))
    rows, carried = scheme().transported_scores(q, k, (w, beta), carry=True)
    logits = rows(0, 11)
    causal = torch.ones(11, 11, dtype=torch.bool).tril()
    for b in range(B):
        for h in range(H):
            torch.testing.assert_close(
                logits[b, h] * causal, by_products(q[b, h], k[b, h], w[b, h], beta[b, h]), **FLOAT64
            )
    # the last query's logits are its q against every key carried to it
    torch.testing.assert_close(carried @ q[..., -1:, :].mT, logits[..., -1:, :].mT, **FLOAT64)


@torch.no_grad()
def test_the_carried_keys_and_logits_token_by_token_equal_the_whole_sequence(monkeypatch):
    """What a KV cache sees: the prompt, then one token at a time (each carries the cached keys through its own
    transition, its own key untransformed), then a few at once; float64, chunks of 4."""
    monkeypatch.setattr(path_module, "CHUNK", 4)
    q, k, _, w, beta, _ = (t.detach() for t in inputs(19, dtype=torch.float64))
    rows, keys_whole = scheme().transported_scores(q, k, (w, beta), carry=True)
    whole = rows(0, 19)
    pieces, keys = [], k[..., :0, :]
    for start, stop in [(0, 6)] + [(t, t + 1) for t in range(6, 12)] + [(12, 19)]:
        new = slice(start, stop)
        rows, keys = scheme().transported_scores(
            q[..., new, :], torch.cat((keys, k[..., new, :]), dim=-2), (w[..., new, :], beta[..., new]), carry=True
        )
        pieces.append(F.pad(rows(0, stop - start), (0, 19 - stop)))
    causal = torch.ones(19, 19, dtype=torch.bool).tril()
    torch.testing.assert_close(torch.cat(pieces, dim=-2) * causal, whole * causal, **FLOAT64)
    torch.testing.assert_close(keys, keys_whole, **FLOAT64)


@torch.no_grad()
@pytest.mark.parametrize("cached", [0, 5], ids=["no-cache", "cache"])
def test_any_block_of_query_rows_equals_those_rows_of_the_whole(monkeypatch, cached):
    """The written-out path asks for one block of queries at a time, wherever its blocks fall against the chunks
    (chunks of 3 here over 14 new tokens, after 5 cached keys or none): each block's rows equal those of the whole."""
    monkeypatch.setattr(path_module, "CHUNK", 3)
    q, k, _, w, beta, _ = (t.detach() for t in inputs(cached + 14, dtype=torch.float64))
    if cached:  # the cache keeps the first tokens' keys carried through the transitions after them
        k = torch.cat(
            (
                scheme().transported_scores(
                    q[..., :cached, :], k[..., :cached, :], (w[..., :cached, :], beta[..., :cached]), carry=True
                )[1],
                k[..., cached:, :],
            ),
            dim=-2,
        )
    new = slice(cached, None)
    rows = scheme().transported_scores(q[..., new, :], k, (w[..., new, :], beta[..., new]), carry=False)[0]
    whole = rows(0, 14)
    assert whole.shape == (B, H, 14, cached + 14)
    for start, stop in [(0, 1), (0, 3), (1, 2), (2, 7), (3, 6), (5, 13), (9, 14), (13, 14), (6, 14)]:
        torch.testing.assert_close(rows(start, stop), whole[..., start:stop, :], **FLOAT64)


def tiny(**settings) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=H, n_embd=H * D, vocab_size=101)
    model = GPT(cfg, PaTHConfig(**settings), train_seq_len=16).eval()
    with torch.no_grad():  # beta away from 1 and the gate away from 1/2, so that a wrong path shows
        for p in (model.pe.beta_bias, *([model.pe.gate_bias] if settings.get("forget_gate") else [])):
            p.normal_(0.0, 1.0)
    return model


@pytest.mark.parametrize("forget_gate", [False, True], ids=["path", "path-fox"])
@torch.no_grad()
def test_cached_decoding_equals_the_full_forward_and_sampling_uses_it(forget_gate, monkeypatch):
    """A prompt, then one token at a time from the KV cache (sample.py's path), over chunks of 8."""
    monkeypatch.setattr(path_module, "CHUNK", 8)
    model = tiny(forget_gate=forget_gate)
    idx = torch.randint(0, 101, (B, 30), generator=torch.Generator().manual_seed(0))
    cache = KVCache()
    pieces = [model(idx[:, :11], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(11, 30)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), model(idx), rtol=1e-5, atol=1e-5)
    prompt, expected = idx[:1, :4], idx[:1, :4]
    for _ in range(6):
        expected = torch.cat([expected, model(expected)[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(generate(model, prompt, max_new_tokens=6, top_k=1), expected)


@pytest.mark.parametrize("forget_gate", [False, True], ids=["path", "path-fox"])
def test_a_training_step_reaches_every_parameter_of_the_scheme(forget_gate):
    model = tiny(forget_gate=forget_gate).train()
    idx = torch.randint(0, 101, (B, 20), generator=torch.Generator().manual_seed(1))
    loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    assert torch.isfinite(loss)
    names = {name for name, p in model.pe.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    want = {"w_down", "w_up", "beta_weight", "beta_bias"} | ({"gate_weight", "gate_bias"} if forget_gate else set())
    assert names == want and set(map(id, model.no_weight_decay())) == {
        id(model.pe.beta_bias),
        *([id(model.pe.gate_bias)] if forget_gate else []),
    }


def test_randomized_positions_are_refused():
    assert not SCHEMES["path"].uses_positions()
    with pytest.raises(PosGPTError, match="pe=path does not use token positions"):
        scheme().check_random_positions(64)
