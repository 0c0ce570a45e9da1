"""Stick-breaking attention (model/pe/stickbreaking.py) against flash-linear-attention's naive PyTorch reference,
``naive_stickbreaking_attn`` of ``fla/ops/stickbreaking_attn/naive.py`` (PyPI ``fla-core``, a test-only dependency,
requirements-dev.txt), run here on the same seeded random inputs: outputs, the gradients of q, k and v, and the
weights left over (its ``rem``), with and without a query's own key (``attend_current``). ``fla/ops/__init__.py``
imports every Triton kernel of the package, which a CPU-only machine cannot import, so the test loads that one file by
its path (it imports only torch).

Also: the paper's equation as a product of loops, a case by hand, blocks of queries equal to one block (forward and
backward), float32 and bfloat16 against float64, logits large enough to saturate sigmoid over a long row, cached
decoding and sampling, the written-out path on every backend and device, a sink and randomized positions refused, and
torch.compile and the command line (slow).

Comparisons in float64 are within 1e-9, far above float64's rounding (1e-16) on any CPU; float32 against float64
within 1e-5.
"""

import json
import math

import pytest
import torch
from compiled_training import assert_same_training
from fla_naive import naive_reference

import model.attention as attention
from core.errors import PosGPTError
from model import GPT, KVCache, ModelConfig
from model.kernels import attend
from model.pe import SCHEMES, ModelDims
from model.pe.stickbreaking import StickBreakingConfig
from model.sampling import generate

B, H, D = 2, 3, 8
DIMS = ModelDims(n_embd=H * D, n_head=H, head_dim=D, train_seq_len=16, init_std=0.02)
FLOAT64 = {"rtol": 1e-9, "atol": 1e-12}
FLOAT32 = {"rtol": 1e-5, "atol": 1e-5}


naive_stickbreaking_attn = naive_reference("stickbreaking_attn", "naive_stickbreaking_attn")


def scheme(attend_current: bool = False):
    return SCHEMES["stickbreaking"](StickBreakingConfig(attend_current=attend_current), DIMS)


def inputs(T: int, seed: int = 0, dtype=torch.float64, spread: float = 2.0) -> list[torch.Tensor]:
    """q, k, v (B, H, T, D), q and k scaled by ``spread`` so that logits range over several units of sigmoid."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=generator, dtype=torch.float64) for _ in range(3))
    return [t.to(dtype).requires_grad_() for t in (q * spread, k * spread, v)]


def reference(q, k, v, attend_current: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """fla's naive reference, whose layout is (B, T, H, D): its output back in (B, H, T, D), and rem (B, H, T)."""
    o, rem = naive_stickbreaking_attn(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attend_current=attend_current
    )
    return o.transpose(1, 2), rem.transpose(1, 2)


def outputs_and_grads(out: torch.Tensor, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The output and the gradients of ``tensors`` through a fixed random projection of it (drawn in float64, so
    every dtype's comparison projects on the same numbers)."""
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64).to(out.dtype)
    return [out.detach(), *torch.autograd.grad((out * weights).sum(), tensors)]


@pytest.mark.parametrize("attend_current", [False, True])
def test_equals_the_naive_reference_forward_backward_and_remainder(attend_current):
    """float64, 37 tokens: the output, the gradients of q, k and v, and the stick left over, 1 - sum_j A_ij."""
    q, k, v = inputs(37)
    probs: list[torch.Tensor] = []
    ours = attend(q, k, v, scheme(attend_current), "auto", capture=probs)
    theirs, rem = reference(q, k, v, attend_current)
    for got, want in zip(outputs_and_grads(ours, [q, k, v]), outputs_and_grads(theirs, [q, k, v])):
        torch.testing.assert_close(got, want, **FLOAT64)
    torch.testing.assert_close(1 - probs[0].sum(-1), rem.detach(), **FLOAT64)
    assert probs[0].dtype == torch.float64 and (probs[0] >= 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float32_and_bfloat16_against_the_float64_reference(dtype):
    """The weights are computed in float32 whatever the scores' dtype, against the float64 reference on the same
    (rounded) inputs. float32 elementwise within 1e-5; bfloat16 computes the scores and the output in 8 significant
    bits (a relative error of 2^-8 = 0.004 each, 0.002-0.004 in norm measured), so within 3e-2 in norm: a wrong
    weight or gradient path is off by 100%."""
    q, k, v = (t.detach().to(dtype) for t in inputs(50))
    low = [t.clone().requires_grad_() for t in (q, k, v)]
    wide = [t.double().requires_grad_() for t in (q, k, v)]
    got = outputs_and_grads(attend(*low, scheme(), "auto"), low)
    want = outputs_and_grads(reference(*wide, False)[0], wide)
    for g, w in zip(got, want):
        if dtype == torch.float32:
            torch.testing.assert_close(g.double(), w, **FLOAT32)
        else:
            assert (g.double() - w).norm() <= 3e-2 * w.norm()


def test_saturated_logits_over_a_long_row_stay_finite_and_equal_the_reference():
    """Logits of magnitude up to ~100 over 600 keys: the product of 600 factors 1 - beta would underflow where it is
    taken directly; in log space the float32 weights still equal the float64 reference's."""
    q, k, v = inputs(600, spread=6.0)
    low = [t.detach().float().requires_grad_() for t in (q, k, v)]
    got = outputs_and_grads(attend(*low, scheme(), "auto"), low)
    want = outputs_and_grads(reference(q, k, v, False)[0], [q, k, v])
    assert all(torch.isfinite(g).all() for g in got)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-4)


def by_loops(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attend_current: bool) -> torch.Tensor:
    """The paper's equation, one head: A_ij = beta_ij prod_{j<k<i} (1 - beta_ik), o_i = sum_{j<i} A_ij v_j (j <= i
    and j < k <= i with a query's own key), as a product, in float64."""
    T, d = q.shape
    out = torch.zeros(T, v.shape[-1], dtype=torch.float64)
    for i in range(T):
        last = i if attend_current else i - 1
        beta = [1 / (1 + math.exp(-float(q[i] @ k[j]) / math.sqrt(d))) for j in range(last + 1)]
        for j in range(last + 1):
            weight = beta[j]
            for m in range(j + 1, last + 1):
                weight *= 1 - beta[m]
            out[i] += weight * v[j].double()
    return out


@pytest.mark.parametrize("attend_current", [False, True])
@torch.no_grad()
def test_the_papers_equation_written_as_loops(attend_current):
    q, k, v = (t.detach() for t in inputs(9))
    got = attend(q, k, v, scheme(attend_current), "auto")
    for b in range(B):
        for h in range(H):
            torch.testing.assert_close(got[b, h], by_loops(q[b, h], k[b, h], v[b, h], attend_current), **FLOAT64)


@torch.no_grad()
def test_a_case_by_hand():
    """q = k = 0: every beta is 1/2, so query i gives its nearest key before it 1/2, the next 1/4, ...; query 0 has
    no key before it and outputs 0. With its own key, that key takes the 1/2 and the others move one step out."""
    v = torch.randn(1, 1, 4, D, dtype=torch.float64)
    zero = torch.zeros(1, 1, 4, D, dtype=torch.float64)
    out = attend(zero, zero, v, scheme(), "auto")[0, 0]
    v = v[0, 0]
    torch.testing.assert_close(out[0], torch.zeros(D, dtype=torch.float64), **FLOAT64)
    torch.testing.assert_close(out[3], v[2] / 2 + v[1] / 4 + v[0] / 8, **FLOAT64)
    own = attend(zero, zero, v[None, None], scheme(attend_current=True), "auto")[0, 0]
    torch.testing.assert_close(own[0], v[0] / 2, **FLOAT64)
    torch.testing.assert_close(own[3], v[3] / 2 + v[2] / 4 + v[1] / 8 + v[0] / 16, **FLOAT64)


def test_blocks_of_queries_equal_one_block_forward_and_backward(monkeypatch):
    """Long evaluation lengths run in blocks of queries (attention._MAX_BLOCK_SCORES bounds each block's scores): 7
    queries a block must give what one block gives, gradients included."""
    q, k, v = inputs(30)
    whole = outputs_and_grads(attend(q, k, v, scheme(), "auto"), [q, k, v])
    monkeypatch.setattr(attention, "_MAX_BLOCK_SCORES", B * H * 30 * 7)
    assert attention.query_block(q, k) == 7
    for got, want in zip(outputs_and_grads(attend(q, k, v, scheme(), "auto"), [q, k, v]), whole):
        torch.testing.assert_close(got, want, **FLOAT64)


def tiny(n_layer: int = 2, **settings) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=n_layer, n_head=H, n_embd=H * D, vocab_size=101, **settings)
    return GPT(cfg, StickBreakingConfig(), train_seq_len=16).eval()


@torch.no_grad()
def test_cached_decoding_equals_the_full_forward_and_sampling_uses_it():
    """A prompt, then one token at a time from the KV cache (sample.py's path): the new query sees every cached key
    through the same weights as in a full forward."""
    model = tiny()
    idx = torch.randint(0, 101, (B, 24), generator=torch.Generator().manual_seed(0))
    cache = KVCache()
    pieces = [model(idx[:, :5], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(5, 24)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), model(idx), **FLOAT32)
    prompt, expected = idx[:1, :4], idx[:1, :4]
    for _ in range(6):
        expected = torch.cat([expected, model(expected)[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(generate(model, prompt, max_new_tokens=6, top_k=1), expected)


def test_a_sink_and_randomized_positions_are_refused():
    with pytest.raises(PosGPTError, match="model.attn_sink: pe=stickbreaking .* no softmax|not a softmax"):
        tiny(attn_sink=True)(torch.zeros(1, 4, dtype=torch.long))
    assert not SCHEMES["stickbreaking"].uses_positions()
    with pytest.raises(PosGPTError, match="pe=stickbreaking does not use token positions"):
        scheme().check_random_positions(64)


@pytest.mark.slow
def test_compiles_as_one_graph_and_trains_as_eager():
    assert_same_training("stickbreaking", "aot_eager")


@pytest.mark.slow
def test_train_eval_and_sample_through_the_cli(cli, tmp_path):
    run_dir = tmp_path / "run"
    done = cli.train_here(run_dir, "pe=stickbreaking", "train.max_steps=3")
    assert done.returncode == 0, done.stderr
    evaluation = ["eval.max_tokens=128", "eval.length_multipliers=[1,2]", "eval.protocols=[nonoverlapping]"]
    done = cli.eval_here(run_dir, *evaluation)
    assert done.returncode == 0, done.stderr
    rows = json.loads((run_dir / "eval" / "extrapolation.json").read_text())["results"]
    assert sorted(row["length"] for row in rows) == [16, 32] and all(math.isfinite(row["ppl"]) for row in rows)
    done = cli.here("sample.py", f"run_dir={run_dir}", "sample.prompt='x = 1'", "sample.max_new_tokens=8")
    assert done.returncode == 0, done.stderr
