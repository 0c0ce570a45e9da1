"""Every attention backend agrees with the `math` reference for every scheme, wherever the backend runs, and
the fast training path (auto backend + fused cross-entropy) takes the same first steps as the reference one."""

import pytest
import torch
import torch.nn.functional as F
from attention_cases import (
    B,
    H,
    T,
    assert_all_close,
    assert_relatively_close,
    attend_at,
    output_and_grads,
    qkv,
    scheme,
)
from omegaconf import OmegaConf

import model.attention as attention
import model.kernels as kernels
import model.loss as loss_module
from core.errors import PosGPTError
from data.windows import random_positions
from experiment.config import TrainConfig
from experiment.plan import section_settings
from model import GPT, ModelConfig
from model.kernels import attend, resolve_backend
from model.pe import SCHEMES
from model.pe import capabilities as cap
from training.optim import OptimizerSettings, build_optimizer, build_scheduler
from training.step import TrainStep

ALL = sorted(SCHEMES)
BIAS = [name for name in ALL if issubclass(SCHEMES[name], cap.ScoreBias)]
MODIFIES = {name: getattr(SCHEMES[name], "modifies", frozenset()) for name in ALL}  # what each hands attention
CONTENT = [name for name in ALL if "score_mod" in MODIFIES[name]]  # a modification that sees the scores
OWN_WEIGHTS = [name for name in ALL if "weights" in MODIFIES[name]]  # weights in place of softmax
TRANSPORTED = [name for name in ALL if "logits" in MODIFIES[name]]  # logits other than q . k
WINDOWED = [name for name in ALL if issubclass(SCHEMES[name], cap.SlidingWindow)]  # a mask, or a block mask
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_auto_picks_flex_for_bias_schemes_on_cuda_and_sdpa_otherwise():
    for name in ALL:
        pe = scheme(name)
        if name in CONTENT + OWN_WEIGHTS + TRANSPORTED:  # the scores themselves, no softmax, or logits not q . k:
            # always the written-out path, on every device, unless the scheme's own kernel is installed for it
            # (model/pe/base.py, hook 8: tests/model/test_kernels_fused_attention.py)
            for device in ("cpu", "cuda"):
                fused = isinstance(pe, cap.FusedKernel) and pe.fused_attention(torch.device(device)) is not None
                own = pe.fused_backend if fused else "math"
                for backend in ("auto", "sdpa", "flex", "math"):
                    want = "math" if backend == "math" else own
                    assert resolve_backend(backend, pe, torch.device(device)) == want
            continue
        assert resolve_backend("auto", pe, torch.device("cpu")) == "sdpa"
        assert resolve_backend("flex", pe, torch.device("cpu")) == "flex"  # eager, forward only
        # a sliding window takes flex too: its block mask skips the blocks outside the window
        biased = name in BIAS + WINDOWED or "pair_term" in MODIFIES[name]
        # With positions 0..T-1 a bias of the distance alone is read from its table, whose score_mod compiles; with
        # positions per token (explicit) the score_mod runs score_bias, and the scheme says whether that compiles.
        for explicit in (False, True):
            table = issubclass(SCHEMES[name], cap.DistanceBias) and not explicit
            compiles = not issubclass(SCHEMES[name], cap.UncompiledScoreBias) or table
            want_auto = "flex" if biased and compiles else "sdpa"
            assert resolve_backend("auto", pe, torch.device("cuda"), explicit) == want_auto
            for forced in ("sdpa", "flex", "math"):
                want = "sdpa" if forced == "flex" and not compiles else forced
                assert resolve_backend(forced, pe, torch.device("cuda"), explicit) == want
    # seen failing on an H200: FIRE's MLP in the kernel, KERPLE's parameters indexed twice in the backward; KERPLE
    # takes flex through its distance table
    assert issubclass(SCHEMES["fire"], cap.UncompiledScoreBias) and issubclass(
        SCHEMES["kerple"], cap.UncompiledScoreBias
    )
    assert resolve_backend("auto", scheme("kerple"), torch.device("cuda")) == "flex"
    assert resolve_backend("auto", scheme("kerple"), torch.device("cuda"), explicit=True) == "sdpa"
    with pytest.raises(PosGPTError, match="attn_backend"):
        resolve_backend("fast", scheme("rope"), torch.device("cpu"))


@pytest.mark.parametrize("blocks", [1, 3], ids=["one-block", "three-blocks"])
@pytest.mark.parametrize("name", ALL)
def test_sdpa_matches_math_forward_and_backward(name, blocks, monkeypatch):
    """Output and gradients of q, k, v and of the scheme's own parameters (layer 1: per-layer ones too)."""
    monkeypatch.setattr(attention, "_MAX_BLOCK_SCORES", B * H * T * (T // blocks + 1))
    pe, (q, k, v) = scheme(name), qkv()
    got, want = output_and_grads("sdpa", pe, q, k, v, layer=1), output_and_grads("math", pe, q, k, v, layer=1)
    assert_all_close(got, want, rtol=1e-4, atol=1e-5)
    if name in BIAS + CONTENT and any(True for _ in pe.parameters()):  # the comparison covers real gradients
        assert any(g.abs().sum() > 0 for g in got[4:])


@pytest.mark.parametrize("name", ALL)
def test_sdpa_matches_math_with_a_kv_cache(name):
    """Queries at positions 35..39 over 40 cached keys: the decoding case."""
    pe, (q, k, v) = scheme(name), qkv(tq=5)
    assert_all_close(output_and_grads("sdpa", pe, q, k, v), output_and_grads("math", pe, q, k, v), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", [n for n in ALL if n not in BIAS + CONTENT + OWN_WEIGHTS + TRANSPORTED + WINDOWED])
def test_sdpa_without_bias_is_causal_sdpa_with_no_mask(name, monkeypatch):
    """The flash-eligible call: is_causal=True and no materialised mask."""
    calls, sdpa = [], F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(kernels.F, "scaled_dot_product_attention", spy)
    attend(*qkv(), scheme(name), "auto")
    assert calls == [{"is_causal": True}]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("name", ALL)
def test_flex_forward_runs_on_cpu_and_matches_math(name):
    """torch 2.13 runs FlexAttention forward on CPU (eager, unfused); there is no CPU backward."""
    pe, (q, k, v) = scheme(name), qkv(requires_grad=False)
    with torch.no_grad():
        torch.testing.assert_close(
            attend(q, k, v, pe, "flex", layer=1), attend(q, k, v, pe, "math", layer=1), rtol=1e-4, atol=1e-5
        )


def test_flex_training_on_cpu_is_a_clear_error():
    with pytest.raises(PosGPTError, match="attn_backend=auto"):
        attend(*qkv(), scheme("alibi"), "flex")


def assert_close_in_bfloat16(name, got, want):
    """bfloat16 results (8 significant bits) against the float32 reference. The output and the gradients of
    q, k and v within 5e-2; the scheme's parameter gradients within 5% of the largest of them: FIRE's per-head
    output bias has a gradient of exactly 0 (softmax ignores a constant added to a row), and the rounding of the
    ~10^5 terms that cancel in it leaves about 0.05 (measured). CoPE's q and k gradients by their norm only,
    within 0.5: the interpolation between integer counts has a slope that jumps at every integer, so rounding
    q . k moves counts across integers (in float32, perturbing q by 2^-9 already moves them by 7% in norm; bf16
    gave 23%, measured); a lost or wrong gradient path is off by 100% or more. DAPE's q and k gradients by their
    norm, within 5e-2: its MLP's LeakyReLU (the reference's) changes slope at 0, and rounding q . k to bf16 moves a
    few inputs across it (2 of 32768 entries off by up to 0.12, 0.7% in norm, measured)."""
    for g, w, label in zip(got[:4], want[:4], ["output", "grad q", "grad k", "grad v"]):
        if name == "cope" and label in ("grad q", "grad k"):
            assert (g.float() - w).norm() <= 0.5 * w.norm(), label
        elif name == "dape" and label in ("grad q", "grad k"):
            assert (g.float() - w).norm() <= 5e-2 * w.norm(), label
        else:
            torch.testing.assert_close(g.float(), w, rtol=5e-2, atol=5e-2, msg=lambda m, label=label: f"{label}: {m}")
    if len(got) > 4:
        g, w = (torch.cat([t.float().flatten() for t in ts]) for ts in (got[4:], want[4:]))
        torch.testing.assert_close(g, w, rtol=5e-2, atol=5e-2 * max(1.0, w.abs().max().item()))


@pytest.mark.parametrize("name", ALL)
def test_bfloat16_sdpa_matches_float32_math(name):
    """What a GPU computes in bf16, on CPU: each scheme's own arithmetic keeps float32 where bf16 would lose
    the result (CoPE's counts: a sum of gates near 100 moves in steps of 0.5 in bf16)."""
    pe = scheme(name)
    q, k, v = qkv(tq=256, tk=256, dtype=torch.bfloat16)
    want = output_and_grads("math", pe, *(t.detach().float().requires_grad_() for t in (q, k, v)))
    assert_close_in_bfloat16(name, output_and_grads("sdpa", pe, q, k, v), want)


@pytest.fixture(autouse=True)
def every_scheme_in_one_process(monkeypatch):
    """A test process compiles FlexAttention for every scheme, dtype and path, where a run compiles it for one
    scheme: the limit on its compilations (model/kernels.py) is a run's, not this file's."""
    monkeypatch.setattr(kernels, "FLEX_RECOMPILE_LIMIT", 10_000)


@CUDA
@pytest.mark.parametrize("backend", ["sdpa", "flex", "auto"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", ALL)
def test_cuda_backends_match_math_forward_and_backward(name, dtype, backend, capsys):
    pe, pe_device = scheme(name, "cuda"), torch.device("cuda")
    q, k, v = qkv(tq=256, tk=256, device="cuda", dtype=dtype)
    want = output_and_grads("math", pe, *(t.detach().float().requires_grad_() for t in (q, k, v)))
    got = output_and_grads(backend, pe, q, k, v)
    assert "FlexAttention failed" not in capsys.readouterr().err, "sdpa ran instead"
    own = isinstance(pe, cap.FusedKernel) and resolve_backend(backend, pe, pe_device, dtype=dtype) == pe.fused_backend
    if dtype == torch.float32 and own:  # the scheme's Triton kernel, which multiplies float32 in TF32 blocks
        assert_relatively_close(got, want, 1e-2)
    elif dtype == torch.float32:
        assert_all_close(got, want, rtol=1e-3, atol=1e-3)
    else:
        assert_close_in_bfloat16(name, got, want)


@pytest.mark.parametrize("name", BIAS)
def test_sdpa_matches_math_with_per_row_positions(name, monkeypatch):
    monkeypatch.setattr(attention, "_MAX_BLOCK_SCORES", B * H * T * (T // 3 + 1))
    pe, (q, k, v) = scheme(name), qkv()
    positions = random_positions(B, T, 4 * T, torch.Generator().manual_seed(3))
    assert_all_close(
        output_and_grads("sdpa", pe, q, k, v, 1, positions),
        output_and_grads("math", pe, q, k, v, 1, positions),
        rtol=1e-4,
        atol=1e-5,
    )


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("name", BIAS)
def test_flex_forward_with_per_row_positions_matches_math_on_cpu(name):
    pe, (q, k, v) = scheme(name), qkv(requires_grad=False)
    positions = random_positions(B, T, 4 * T, torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(
            attend_at("flex", pe, q, k, v, 1, positions),
            attend_at("math", pe, q, k, v, 1, positions),
            rtol=1e-4,
            atol=1e-5,
        )


@CUDA
@pytest.mark.parametrize("name", BIAS)
def test_cuda_flex_gradients_of_bias_parameters_with_per_row_positions(name, capsys):
    """FlexAttention's score_mod reads the scheme's parameters and the positions through its closure: the
    gradients that reach them must equal the written-out path's."""
    pe = scheme(name, "cuda")
    q, k, v = qkv(tq=256, tk=256, device="cuda")
    positions = random_positions(B, 256, 4096, torch.Generator().manual_seed(3)).cuda()
    assert_all_close(
        output_and_grads("flex", pe, q, k, v, 1, positions),
        output_and_grads("math", pe, q, k, v, 1, positions),
        rtol=1e-3,
        atol=1e-3,
    )
    assert "FlexAttention failed" not in capsys.readouterr().err, "sdpa ran instead"


SEQ_LEN, VOCAB = 16, 300


def tiny(name, backend, fused_ce="auto"):
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=4, n_embd=32, vocab_size=VOCAB, attn_backend=backend, fused_ce=fused_ce)
    return GPT(cfg, SCHEMES[name].config_class(), train_seq_len=SEQ_LEN)


@pytest.mark.parametrize("name", ALL)
def test_fast_path_first_steps_match_the_reference(name, monkeypatch):
    """auto attention + fused chunked cross-entropy vs math attention + F.cross_entropy: same grads, same losses."""
    monkeypatch.setattr(loss_module, "FUSED_CHUNK", 7 * 320)  # 7-row chunks of the padded vocabulary
    train_cfg = OmegaConf.structured(TrainConfig(lr=1e-3, warmup_steps=1, max_steps=10))
    settings = section_settings(OptimizerSettings, train_cfg)
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, VOCAB, (4, SEQ_LEN + 1), generator=generator) for _ in range(3)]
    results = []
    for backend, fused in (("auto", "always"), ("math", "never")):
        model = tiny(name, backend, fused)
        first = batches[0]
        model(first[:, :-1], first[:, 1:]).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        optimizer = build_optimizer(model, settings, torch.device("cpu"))
        step = TrainStep(
            model,
            optimizer,
            build_scheduler(optimizer, settings),
            1,
            train_cfg.grad_clip,
            torch.device("cpu"),
            torch.float32,
        )
        losses = torch.stack([step(b[:, :-1], b[:, 1:])[0] for b in batches])
        results.append((grads, losses))
    (fast_grads, fast_losses), (ref_grads, ref_losses) = results
    for n in ref_grads:
        torch.testing.assert_close(fast_grads[n], ref_grads[n], rtol=1e-4, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")
    torch.testing.assert_close(fast_losses, ref_losses, rtol=1e-5, atol=1e-6)
