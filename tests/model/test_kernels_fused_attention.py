"""A scheme's own kernel for its whole attention (model/pe/base.py, hook 8): flash-linear-attention's Triton kernels
of stick-breaking and PaTH attention, on CUDA where the package is installed (requirements-dev.txt installs it).

On the CPU, the dispatch: which passes reach the kernel (a full causal pass) and which run the written-out path (a KV
cache, captured probabilities, packed documents, a sink, model.attn_backend=math), that the kernel's output is the
layer's, and that a kernel failing at its first use is given up, said once and recorded. The kernel there is the
written-out path itself, standing in for the Triton one, so the outputs must be equal. Also on the CPU: the memory
model's prediction for the kernel's path, and the real kernels run by Triton's interpreter
(tests/support/fla_interpreted.py).
On CUDA (skipped without): each real kernel equals the written-out path forward and backward, in float32 and under
bfloat16 autocast, at a length that is not a whole number of the kernels' blocks, and a model on CUDA picks it (no
silent fallback)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch
from attention_cases import assert_relatively_close
from cli_runs import REPO

from core.errors import PosGPTError
from experiment.compose import compose_config
from experiment.estimate import scoring_memory, training_memory
from model import GPT, KVCache, ModelConfig
from model.attention import written_out_attention
from model.kernels import resolve_backend, resolve_layer_backends
from model.pe import SCHEMES
from model.pe import capabilities as cap
from model.pe.path import PaTHConfig
from model.pe.stickbreaking import StickBreakingConfig

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
FUSED = ["stickbreaking", "path"]
VOCAB = 101


def tiny(name: str, device: str = "cpu", backend: str = "auto", sink: bool = False, **settings) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=128, vocab_size=VOCAB, attn_backend=backend, attn_sink=sink)
    config = {"stickbreaking": StickBreakingConfig, "path": PaTHConfig}[name](**settings)
    model = GPT(cfg, config, train_seq_len=64).to(device)
    if name == "path":
        with torch.no_grad():  # beta away from 1 and the gate away from 1/2, so that a wrong transition shows
            for p in (model.pe.beta_bias, *([model.pe.gate_bias] if settings.get("forget_gate") else [])):
                p.normal_(0.0, 1.0)
    return model


def tokens(rows: int, length: int, device: str = "cpu") -> torch.Tensor:
    return torch.randint(0, VOCAB, (rows, length), generator=torch.Generator().manual_seed(1)).to(device)


def written_out(pe):
    """The written-out path as a kernel of hook 8's signature, and the list of the calls it gets."""
    calls = []

    def kernel(q, k, v, call):
        calls.append(q.shape)
        return written_out_attention(q, k, v, call)[0]  # with the scheme's changes of the layer's input

    return kernel, calls


@pytest.fixture
def stand_in(monkeypatch):
    """Every fused scheme's hook 8 returns the written-out path on any device, which takes every dtype (``dtypes``:
    those the real kernel takes, to stand in for them); the calls are counted."""
    calls = {}

    def install(name: str, model: GPT, dtypes: frozenset | None = None):
        kernel, calls[name] = written_out(model.pe)
        monkeypatch.setattr(type(model.pe), "fused_attention", lambda self, device: kernel)
        if dtypes is None:
            dtypes = frozenset({torch.float32, torch.bfloat16, torch.float16})
        monkeypatch.setattr(type(model.pe), "fused_dtypes", dtypes)
        model.resolve_attention_paths()  # the paths were resolved when the model was built, without a kernel on CPU
        return calls[name]

    return install


@pytest.mark.parametrize("name", FUSED)
def test_a_full_pass_runs_the_schemes_kernel_and_the_rest_the_written_out_path(name, stand_in):
    model = tiny(name)
    with torch.no_grad():
        want = model(tokens(2, 40))
    calls = stand_in(name, model)
    cpu = torch.device("cpu")
    assert resolve_layer_backends("auto", model.pe, cpu) == "fla"
    with torch.no_grad():
        torch.testing.assert_close(model(tokens(2, 40)), want, rtol=0, atol=0)
    assert len(calls) == 2  # one per layer
    probs, cache = [], KVCache()
    with torch.no_grad():
        model(tokens(2, 40), capture=probs)  # attention diagnostics: the written-out probabilities
        model(tokens(2, 40)[:, :30], cache=cache)  # a prompt into the cache, then a token from it
        model(tokens(2, 40)[:, 30:31], cache=cache)
        model(tokens(2, 40), documents=torch.zeros(2, 40, dtype=torch.long))  # packed documents: positions per token
    assert len(calls) == 2 and len(probs) == 2
    assert resolve_backend("math", model.pe, cpu) == "math"  # asked for by name
    assert resolve_backend("auto", model.pe, cpu, explicit=True) == "math"
    if "weights" in model.pe.modifies:  # no softmax, so no sink logit: refused where the path is chosen
        with pytest.raises(PosGPTError, match="no denominator for a sink logit"):
            resolve_backend("auto", model.pe, cpu, sink=True)
    else:
        assert resolve_backend("auto", model.pe, cpu, sink=True) == "math"


def test_the_layer_outputs_what_the_kernel_computes(monkeypatch):
    model = tiny("stickbreaking")
    with torch.no_grad():
        want = model(tokens(2, 40))
        monkeypatch.setattr(type(model.pe), "fused_attention", lambda self, device: lambda q, k, v, call: 0 * v)
        model.resolve_attention_paths()  # resolved when it was built, without a kernel on the CPU
        assert not torch.allclose(model(tokens(2, 40)), want)  # attention's output is no longer the scheme's


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", FUSED)
def test_a_pass_in_a_dtype_the_kernel_does_not_take_runs_the_written_out_path_and_says_so(name, dtype, stand_in):
    """PaTH's kernel takes bf16 and fp16 only (its float32 backward is past an H200's shared memory): chosen before
    the pass, since a failure in the backward pass is past any fallback."""
    model = tiny(name).train()
    takes = dtype in SCHEMES[name].fused_dtypes
    calls = stand_in(name, model, SCHEMES[name].fused_dtypes)
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        model(tokens(2, 40)[:, :-1], tokens(2, 40)[:, 1:]).backward()
    assert len(calls) == (2 if takes else 0)
    assert model.attention_backend(torch.device("cpu"), dtype=dtype) == ("fla" if takes else "math")
    summary = model.describe_attention(torch.device("cpu"), dtype)[0]  # train.py's lines of the model's layers
    assert ("math in float32: fla takes bfloat16, float16" in summary) is not takes, summary
    assert resolve_layer_backends("auto", model.pe, torch.device("cpu"), dtype=dtype) == ("fla" if takes else "math")


def test_a_sink_runs_the_written_out_path(stand_in):
    model = tiny("path", sink=True)
    calls = stand_in("path", model)
    with torch.no_grad():
        model(tokens(2, 40))
    assert calls == [] and resolve_layer_backends("auto", model.pe, torch.device("cpu"), sink=True) == "math"


def test_a_kernel_failing_at_its_first_use_is_given_up_said_once_and_recorded(monkeypatch, capsys):
    model = tiny("stickbreaking")
    with torch.no_grad():
        want = model(tokens(2, 40))
    calls = []

    def failing(q, k, v, call):
        calls.append(call.layer)
        raise RuntimeError("triton: no kernel for this GPU\nlong log")

    monkeypatch.setattr(type(model.pe), "fused_attention", lambda self, device: failing)
    model.resolve_attention_paths()  # resolved when it was built, without a kernel on the CPU
    with torch.no_grad():
        torch.testing.assert_close(model(tokens(2, 40)), want, rtol=0, atol=0)
        model(tokens(2, 40))
    assert calls == [0]  # given up at the first failure: the second layer and the next pass run the written-out path
    assert model.attention_fallbacks["cpu"]["fla"].failure == "RuntimeError: triton: no kernel for this GPU"
    assert model.attention_backend(torch.device("cpu")) == "math"  # what the runs' records name
    err = capsys.readouterr().err
    assert err.count("warning: fla attention failed (RuntimeError: triton: no kernel for this GPU)") == 1


@pytest.mark.parametrize("name", FUSED)
def test_no_kernel_on_the_cpu(name):
    pe = tiny(name).pe
    assert pe.fused_attention(torch.device("cpu")) is None
    assert resolve_backend("auto", pe, torch.device("cpu")) == "math"


def outputs_and_gradients(model: GPT, idx: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        loss = model(idx[:, :-1], idx[:, 1:], reduction="none")
    loss.sum().backward()
    return [loss.float()] + [p.grad.float() for p in model.parameters() if p.grad is not None]


@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "name, settings",
    [
        ("stickbreaking", {}),
        ("stickbreaking", {"attend_current": True}),
        ("path", {}),
        ("path", {"forget_gate": True}),
    ],
    ids=["stickbreaking", "stickbreaking-current", "path", "path-fox"],
)
def test_the_cuda_kernel_equals_the_written_out_path_forward_and_backward(name, settings, dtype, capsys):
    fused, math = (tiny(name, "cuda", backend, **settings) for backend in ("auto", "math"))
    if dtype not in fused.pe.fused_dtypes:  # the written-out path on both sides (a CPU test checks the dispatch)
        pytest.skip(f"{name}'s kernel does not take {dtype}")
    # installed: no silent fallback
    assert resolve_layer_backends("auto", fused.pe, torch.device("cuda"), dtype=dtype) == "fla"
    idx = tokens(4, 101, "cuda")  # 100 positions: not a whole number of the kernels' 64-token blocks
    got, want = outputs_and_gradients(fused, idx, dtype), outputs_and_gradients(math, idx, dtype)
    assert_relatively_close(got, want, 1e-2 if dtype == torch.float32 else 5e-2)  # the losses, then the gradients
    assert "attention failed" not in capsys.readouterr().err


def test_every_scheme_with_a_kernel_of_its_own_names_its_backend():
    """hook 8's parts go together: a scheme that returns a kernel says what its runs record and which kernel it is."""
    for name, scheme in SCHEMES.items():
        if issubclass(scheme, cap.FusedKernel):
            assert scheme.fused_backend and all(scheme.fused_kernel), name
            assert scheme.fused_attention is not cap.FusedKernel.fused_attention, name


@pytest.mark.parametrize("name", FUSED)
def test_the_memory_model_keeps_no_length_squared_term_for_the_schemes_kernel(name, monkeypatch):
    """experiment/estimate.py: where the scheme's kernel runs (a CUDA device, the kernel installed: standing in here),
    attention keeps what flash sdpa keeps, not the written-out path's scores."""
    cfg, bf16 = compose_config([f"pe={name}", "train.seq_len=1024"]), torch.bfloat16  # a GPU's autocast dtype
    written = training_memory(cfg, "cuda", bf16), scoring_memory(cfg, 8192, "math", bf16)
    monkeypatch.setattr(SCHEMES[name], "fused_attention", lambda self, device: lambda q, k, v, call: v)
    fused = training_memory(cfg, "cuda", bf16), scoring_memory(cfg, 8192, "fla", bf16)
    assert fused[0].parts["recomputed_block"] == 0 < written[0].parts["recomputed_block"]  # no block of T x T
    assert fused[1].parts["attention"] == 0 < written[1].parts["attention"]
    rope = compose_config(["pe=rope", "train.seq_len=1024"])  # RoPE: flash sdpa, the same model otherwise
    assert fused[0].parts["activations"] <= training_memory(rope, "cuda", bf16).parts["activations"] * 1.01


def test_a_run_whose_kernel_fails_at_its_first_step_records_the_path_that_runs(cli, tmp_path, monkeypatch):
    """A kernel that fails in the forward pass fails in the one train.py runs before it writes the run (training/
    loop.py, _check_first_forward): it is given up there, said once, and the run records the path that trains from
    step 0 (here the stand-in fails, and math ran). A kernel that failed only in training's first step would be
    recorded again after it."""

    def failing(q, k, v, call):
        raise RuntimeError("triton: no kernel for this GPU")

    monkeypatch.setattr(SCHEMES["stickbreaking"], "fused_attention", lambda self, device: failing)
    run_dir = tmp_path / "run"
    done = cli.train_here(run_dir, "pe=stickbreaking", "train.max_steps=3")
    assert done.returncode == 0, done.stderr
    assert "layer 0: stickbreaking: fla" in done.stdout and done.stderr.count("warning: fla attention failed") == 1
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["attn_backend"]) for r in rows if "attn_backend" in r] == [(0, "math")]


@pytest.mark.slow  # a process of its own: Triton reads TRITON_INTERPRET when it defines its kernels
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (requirements-dev.txt)")
def test_the_real_kernels_in_tritons_cpu_interpreter_equal_the_written_out_path():
    """flash-linear-attention's Triton kernels themselves, run on the CPU by Triton's interpreter through the schemes'
    own wrappers (tests/support/fla_interpreted.py): every layer ran the kernel, and losses and every gradient equal the
    written-out path's to 1e-4 of their size (float32; measured 2e-7 to 6e-6)."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "tests/support/fla_interpreted.py"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(row["scheme"], row["settings"]) for row in rows] == [
        ("stickbreaking", {}),
        ("stickbreaking", {"attend_current": True}),
        ("path", {}),
        ("path", {"forget_gate": True}),
    ]
    for row in rows:
        assert row["layers"] == [0, 1] and row["worst"] < 1e-4, row
