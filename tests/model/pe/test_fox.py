"""FoX, the Forgetting Transformer (model/pe/fox.py): one attention layer against the paper's equations written
out as loops and against a transcription of the reference code's own PyTorch formulation, a case small enough to
compute by hand, every attention path (math, blockwise sdpa, FlexAttention) alike, cached decoding equal to the
full forward, the gate's parameters (initialisation, weight decay, gradients), randomized positions refused,
torch.compile, and one tiny run through train.py, eval.py, sample.py and train.init_from."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from compiled_training import assert_same_training
from omegaconf import OmegaConf

import model.attention as attention
import model.kernels as kernels
from core.errors import PosGPTError
from experiment.config import TrainConfig
from experiment.plan import section_settings
from model import GPT, KVCache, ModelConfig
from model.attention import AttentionCall, default_state, written_out_attention
from model.kernels import blockwise_sdpa, resolve_backend, resolve_path
from model.pe import SCHEMES
from model.pe.capabilities import AttentionMods
from model.pe.fox import CumulativeTerm, FoXConfig
from model.sampling import generate
from training.optim import OptimizerSettings, build_optimizer

B, H, C = 2, 2, 8  # head dimension C / H = 4
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def tiny(backend: str = "math", n_layer: int = 2, n_head: int = H, n_embd: int = C, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=101, attn_backend=backend)
    model = GPT(cfg, FoXConfig(), train_seq_len=16).eval()
    with torch.no_grad():  # gates far from 1/2 and from each other, so a wrong bias cannot hide
        model.pe.gate_weight.normal_(0.0, 1.0)
        model.pe.gate_bias.normal_(1.0, 1.0)
    return model


def layer_by_loops(attn, pe, layer: int, x: torch.Tensor) -> torch.Tensor:
    """One attention layer of the paper (eqs. 5-8), scalar by scalar: f_t = sigmoid(w_h . x_t + b_h),
    D_ij = sum_{l=j+1..i} log f_l, o_i = sum_{j<=i} softmax_j(q_i . k_j / sqrt(d) + D_ij) v_j."""
    batch, length, width = x.shape
    d = width // attn.n_head
    q, k, v = attn.qkv(x).split(width, dim=2)
    out = torch.zeros(batch, length, width, dtype=torch.float64)
    for b in range(batch):
        for h in range(attn.n_head):
            w, bias = pe.gate_weight[layer, h], pe.gate_bias[layer, h]
            gate = [torch.sigmoid(sum(w[c] * x[b, t, c] for c in range(width)) + bias) for t in range(length)]
            head = slice(h * d, (h + 1) * d)
            for i in range(length):
                logits = []
                for j in range(i + 1):
                    decay = sum(math.log(gate[t]) for t in range(j + 1, i + 1))
                    logits.append(float(q[b, i, head] @ k[b, j, head]) / math.sqrt(d) + decay)
                top = max(logits)
                weights = [math.exp(s - top) for s in logits]
                for j in range(i + 1):
                    out[b, i, head] += weights[j] / sum(weights) * v[b, j, head].double()
    return attn.proj(out.float())


def layer_by_the_reference(attn, pe, layer: int, x: torch.Tensor) -> torch.Tensor:
    """The reference code's formulation (zhixuan-lin/forgetting-transformer: ForgettingAttentionLayer's gate and
    the pure-PyTorch attention of ops/forgetting_attention.py's test), transcribed."""
    batch, length, width = x.shape
    q, k, v = (t.view(batch, length, attn.n_head, -1).transpose(1, 2) for t in attn.qkv(x).split(width, dim=2))
    fgate_logit = F.linear(x, pe.gate_weight[layer], pe.gate_bias[layer]).transpose(1, 2)  # b t h -> b h t
    log_fgate = F.logsigmoid(fgate_logit.float())
    p = torch.matmul(q, k.transpose(2, 3)) * (1 / math.sqrt(q.shape[-1]))
    log_lambda = torch.cumsum(log_fgate, dim=-1)
    decay_bias = log_lambda[..., -length:, None] - log_lambda[..., None, :]
    p = p + decay_bias
    mask = torch.tril(torch.ones((length, length)))
    p[:, :, mask == 0] = float("-inf")
    o = torch.matmul(torch.softmax(p, dim=-1), v)
    return attn.proj(o.transpose(1, 2).reshape(batch, length, width))


@pytest.mark.parametrize("backend", ["math", "sdpa", "flex"])
@torch.no_grad()
def test_one_layer_equals_the_paper_by_loops_and_the_reference_formulation(backend):
    model = tiny(backend)
    x = torch.randn(B, 6, C, generator=torch.Generator().manual_seed(1))
    attn, layer = model.blocks[1].attn, 1
    kernel = model.kernels_on(x.device)[layer]
    got = attn(x, model.pe, default_state(model.pe, 6, 6, x.device), None, layer, kernel)
    torch.testing.assert_close(got, layer_by_loops(attn, model.pe, layer, x), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got, layer_by_the_reference(attn, model.pe, layer, x), rtol=1e-5, atol=1e-6)


@torch.no_grad()
def test_a_case_by_hand():
    """Gates of exactly 1/2 (w = 0, b = 0) and q = k = 0: query 2 weighs keys 0, 1, 2 as 1/4 : 1/2 : 1, so its
    output is (v0 + 2 v1 + 4 v2) / 7; query 1: (v0 + 2 v1) / 3."""
    model = tiny(n_layer=1)
    pe, attn = model.pe, model.blocks[0].attn
    pe.gate_weight.zero_(), pe.gate_bias.zero_()
    attn.qkv.weight[: 2 * C].zero_(), attn.qkv.bias.zero_()  # q = k = 0
    attn.qkv.weight[2 * C :] = torch.eye(C)  # v = x
    attn.proj.weight.copy_(torch.eye(C)), attn.proj.bias.zero_()
    x = torch.randn(1, 3, C, generator=torch.Generator().manual_seed(2))
    out = attn(x, pe, default_state(pe, 3, 3, x.device), None, 0, model.kernels_on(x.device)[0])[0]
    torch.testing.assert_close(out[1], (x[0, 0] + 2 * x[0, 1]) / 3)
    torch.testing.assert_close(out[2], (x[0, 0] + 2 * x[0, 1] + 4 * x[0, 2]) / 7)


@pytest.mark.parametrize("path", ["folded", "blockwise-one-block", "blockwise-three-blocks"])
def test_both_sdpa_paths_equal_math_forward_and_backward(path, monkeypatch):
    """The bias folded into q and k (float32, no cache), and the blockwise mask (bfloat16, decoding): outputs and
    the gradients of q, k, v and of the sums c, whose magnitude (c down to -200) tests the fold's rounding."""
    length = 120
    monkeypatch.setattr(attention, "_MAX_BLOCK_SCORES", B * H * length * (length // 3 + 1))
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, length, 4, generator=generator).requires_grad_() for _ in range(3))
    sums = F.logsigmoid(torch.randn(B, H, length, generator=generator)).cumsum(-1).requires_grad_()
    pe = tiny().pe
    state, route = default_state(pe, length, length, q.device), resolve_path(pe, "sdpa", q.device)
    call = AttentionCall(pe, route, state, mods=AttentionMods(pair_term=CumulativeTerm(sums)))
    if path == "folded":
        got = call.mods.pair_term.folded(q, k, v)
    else:
        if path == "blockwise-one-block":
            monkeypatch.setattr(attention, "_MAX_BLOCK_SCORES", 1 << 24)
        got = blockwise_sdpa(q, k, v, call)
    want = written_out_attention(q, k, v, call)[0]
    gradients = [torch.autograd.grad(out.square().sum(), (q, k, v, sums)) for out in (got, want)]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for g, w in zip(*gradients):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def forward_and_grads(model: GPT, idx: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss = model(idx, idx)
    loss.backward()
    return [loss.detach()] + [p.grad.clone() for p in model.parameters()]


def test_the_model_on_sdpa_equals_math_forward_and_backward():
    """The loss and the gradients of every parameter, the gates' included."""
    idx = torch.randint(0, 101, (B, 40), generator=torch.Generator().manual_seed(0))
    got, want = forward_and_grads(tiny("sdpa").train(), idx), forward_and_grads(tiny("math").train(), idx)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    model = tiny("sdpa").train()
    forward_and_grads(model, idx)
    assert model.pe.gate_weight.grad.abs().min() > 0 and model.pe.gate_bias.grad.abs().min() > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["flex", "sdpa"])
def test_cuda_paths_equal_math_forward_and_backward(backend, monkeypatch, capsys):
    """FlexAttention's score_mod reads c through its closure: the gradients reaching the gates through it must
    equal the written-out path's (head size 16, FlexAttention's smallest)."""
    monkeypatch.setattr(kernels, "FLEX_RECOMPILE_LIMIT", 10_000)  # a run's limit; this process compiles many
    idx = torch.randint(0, 101, (B, 256), generator=torch.Generator().manual_seed(0)).cuda()
    models = [tiny(name, n_head=4, n_embd=64).cuda().train() for name in (backend, "math")]
    for g, w in zip(*(forward_and_grads(model, idx) for model in models)):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-4)
    assert "FlexAttention failed" not in capsys.readouterr().err, "sdpa ran instead"


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@torch.no_grad()
def test_cached_decoding_equals_the_full_forward(backend):
    """A prompt, then one token at a time: the cumulative sums go on from the cached keys' (without them every
    step would start from c = 0 and the gates of the cached tokens would be lost)."""
    model = tiny(backend)
    idx = torch.randint(0, 101, (B, 20), generator=torch.Generator().manual_seed(0))
    cache = KVCache()
    pieces = [model(idx[:, :5], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(5, 20)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), model(idx), rtol=1e-4, atol=1e-5)
    assert [memo["sums"].shape for memo in cache.layer_memo] == [(B, H, 20)] * 2


def test_sampling_with_the_cache_equals_greedy_full_forwards():
    model = tiny("sdpa")
    prompt = torch.randint(0, 101, (1, 4), generator=torch.Generator().manual_seed(0))
    expected = prompt
    with torch.no_grad():
        for _ in range(8):
            expected = torch.cat([expected, model(expected)[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(generate(model, prompt, max_new_tokens=8, top_k=1), expected)


def test_the_gate_is_initialised_as_the_reference_and_only_its_weight_is_decayed():
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=3, n_head=4, n_embd=64, vocab_size=101), FoXConfig(), train_seq_len=16)
    pe = model.pe
    assert pe.gate_weight.shape == (3, 4, 64) and pe.gate_bias.shape == (3, 4)
    assert pe.gate_weight.std().item() == pytest.approx(0.02, rel=0.1) and not pe.gate_bias.any()
    settings = section_settings(OptimizerSettings, OmegaConf.structured(TrainConfig()))
    optimizer = build_optimizer(model, settings, torch.device("cpu"))
    decayed = {id(p) for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert id(pe.gate_weight) in decayed and id(pe.gate_bias) not in decayed


def test_no_position_is_used_so_randomized_positions_are_refused():
    assert not SCHEMES["fox"].uses_positions()
    with pytest.raises(PosGPTError, match="pe=fox does not use token positions"):
        tiny().pe.check_random_positions(64)


def test_auto_runs_flex_on_cuda_and_the_fused_causal_kernel_on_cpu(monkeypatch):
    """On CPU in float32, training's full-length forward folds the bias into q and k: SDPA with is_causal and no
    mask, once per layer; decoding from a cache takes the blockwise mask path."""
    pe = tiny().pe
    assert resolve_backend("auto", pe, torch.device("cuda")) == "flex"
    assert resolve_backend("auto", pe, torch.device("cpu")) == "sdpa"
    calls, sdpa = [], F.scaled_dot_product_attention
    spy = lambda *args, **kwargs: calls.append(kwargs) or sdpa(*args, **kwargs)  # noqa: E731
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    model, cache = tiny("auto"), KVCache()
    model(torch.zeros(1, 4, dtype=torch.long), cache=cache)
    assert [sorted(kw) for kw in calls] == [["is_causal", "scale"]] * 2
    calls.clear()
    model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
    assert [sorted(kw) for kw in calls] == [["attn_mask"]] * 2


@pytest.mark.slow
def test_compiles_as_one_graph_and_trains_as_eager():
    assert_same_training("fox", "aot_eager")


@pytest.fixture(scope="module")
def fox_run(cli):
    run_dir = cli.base / "fox"
    if not (run_dir / "checkpoints" / "last.pt").exists():
        done = cli.train_here(run_dir, "pe=fox", "train.max_steps=5")
        assert done.returncode == 0, done.stderr
    return run_dir


@pytest.mark.slow
def test_train_eval_sample_and_init_from_through_the_cli(cli, fox_run, tmp_path):
    evaluation = ["eval.max_tokens=128", "eval.length_multipliers=[1,2]", "eval.protocols=[nonoverlapping]"]
    done = cli.eval_here(fox_run, *evaluation)
    assert done.returncode == 0, done.stderr
    rows = json.loads((fox_run / "eval" / "extrapolation.json").read_text())["results"]
    assert sorted(row["length"] for row in rows) == [16, 32] and all(math.isfinite(row["ppl"]) for row in rows)
    done = cli.here("sample.py", f"run_dir={fox_run}", "sample.prompt='x = 1'", "sample.max_new_tokens=8")
    assert done.returncode == 0, done.stderr
    done = cli.train_here(tmp_path / "child", "pe=fox", f"train.init_from={fox_run}", "train.max_steps=1")
    assert done.returncode == 0, done.stderr
    refused = cli.train_here(tmp_path / "random", "pe=fox", "train.random_positions=64", "train.max_steps=1")
    assert refused.returncode == 2 and "pe=fox does not use token positions" in refused.stderr
