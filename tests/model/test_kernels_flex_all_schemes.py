"""FlexAttention (forward, on CPU) equals the written-out math path for every scheme with a score bias, found
through the registry so that a scheme added later is covered: at lengths that are not multiples of its block
size (128), while decoding with a KV cache, with per-row positions, and through the whole model (there also
every scheme with a cumulative bias, which only the model computes). And if
FlexAttention fails at first use, the layer's kernel warns once and runs sdpa, which its records then name."""

import pytest
import torch
from attention_cases import B, D, H, attend_at, qkv, scheme
from torch._dynamo.testing import CompileCounterWithBackend

import model.kernels as kernels
from data.windows import random_positions
from model import GPT, KVCache, ModelConfig
from model.attention import AttentionCall, default_state
from model.kernels import attend, choose_kernel, resolve_backend
from model.pe import SCHEMES
from model.pe import capabilities as cap

BIAS = sorted(name for name, cls in SCHEMES.items() if issubclass(cls, cap.ScoreBias))
CUMULATIVE = sorted(
    name for name, cls in SCHEMES.items() if "pair_term" in getattr(cls, "modifies", ())
)  # its data: the model's
AWKWARD = [1, 127, 129, 300]  # FlexAttention's blocks hold 128 queries and 128 keys
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


@pytest.mark.parametrize("length", [*AWKWARD, 128, 256, 1000])
def test_the_causal_block_mask_is_create_block_masks_without_its_dense_mask(length):
    """model/kernels.py builds the causal BlockMask from its block structure (create_block_mask materialises
    the whole length x length mask first: 2.6 GB at 16K tokens); every field must be create_block_mask's."""
    from torch.nn.attention.flex_attention import create_block_mask

    ours = kernels._make_causal_block_mask(length, "cpu")
    theirs = create_block_mask(kernels._causal, B=None, H=None, Q_LEN=length, KV_LEN=length, device="cpu")
    assert ours.seq_lengths == theirs.seq_lengths == (length, length)
    for field in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
        assert torch.equal(getattr(ours, field), getattr(theirs, field)), field
    for field in ("q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"):  # what the backward reads
        assert torch.equal(getattr(ours, field), getattr(theirs, field)), field
    assert torch.equal(ours.to_dense(), theirs.to_dense())


def test_the_registry_has_bias_schemes():
    assert {"alibi", "t5", "kerple", "fire"} <= set(BIAS)


@pytest.mark.slow
@pytest.mark.parametrize("length", AWKWARD)
@pytest.mark.parametrize("name", BIAS)
@torch.no_grad()
def test_flex_matches_math_at_awkward_lengths(name, length):
    pe, (q, k, v) = scheme(name), qkv(length, length, requires_grad=False)
    for layer in (0, 1):
        torch.testing.assert_close(
            attend(q, k, v, pe, "flex", layer=layer), attend(q, k, v, pe, "math", layer=layer), **TOLERANCE
        )


@pytest.mark.parametrize("length", [129, 300])
@pytest.mark.parametrize("name", BIAS)
@torch.no_grad()
def test_flex_matches_math_with_per_row_positions(name, length):
    pe, (q, k, v) = scheme(name), qkv(length, length, requires_grad=False)
    positions = random_positions(B, length, 4 * length, torch.Generator().manual_seed(3))
    torch.testing.assert_close(
        attend_at("flex", pe, q, k, v, 1, positions), attend_at("math", pe, q, k, v, 1, positions), **TOLERANCE
    )


def tiny_model(name: str, backend: str) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=4, n_embd=32, vocab_size=101, attn_backend=backend)
    return GPT(cfg, SCHEMES[name].config_class(), train_seq_len=64).eval()


@pytest.mark.parametrize("name", BIAS + CUMULATIVE)
@torch.no_grad()
def test_model_through_flex_matches_math_with_a_prompt_then_decoding(name):
    """A 131-token prompt in one forward pass (flex), then 3 tokens one at a time from the KV cache (queries
    after the first key: sdpa's blockwise path), against the math path over the same tokens."""
    idx = torch.randint(0, 101, (2, 134), generator=torch.Generator().manual_seed(0))
    flex, math = tiny_model(name, "flex"), tiny_model(name, "math")
    torch.testing.assert_close(flex(idx[:, :131]), math(idx[:, :131]), **TOLERANCE)
    cache_flex, cache_math = KVCache(), KVCache()
    flex(idx[:, :131], cache=cache_flex), math(idx[:, :131], cache=cache_math)
    for t in range(131, 134):
        got, want = flex(idx[:, t : t + 1], cache=cache_flex), math(idx[:, t : t + 1], cache=cache_math)
        torch.testing.assert_close(got, want, **TOLERANCE)
    torch.testing.assert_close(got[:, -1], math(idx)[:, -1], **TOLERANCE)  # decoding = one full pass


@pytest.mark.parametrize("name", BIAS)
@torch.no_grad()
def test_flex_with_a_kv_cache_matches_math(name):
    """Queries 293..299 over 300 keys (not a multiple of 128), through attend."""
    pe, (q, k, v) = scheme(name), qkv(7, 300, requires_grad=False)
    torch.testing.assert_close(attend(q, k, v, pe, "flex", layer=1), attend(q, k, v, pe, "math", layer=1), **TOLERANCE)


@torch.no_grad()
def test_a_failing_flex_falls_back_to_sdpa_once_with_one_warning(monkeypatch, capsys):
    calls = []

    def broken(*args):
        calls.append(1)
        raise RuntimeError("triton: no kernel for this GPU\nlong traceback")

    monkeypatch.setattr(kernels, "_flex_attention", broken)
    pe, (q, k, v) = scheme("alibi"), qkv(requires_grad=False)
    cuda = torch.device("cuda")
    kernel = choose_kernel(pe, "flex", cuda)  # a layer's, as the model chooses it for CUDA
    assert kernel.backend() == resolve_backend("auto", pe, cuda) == "flex"
    call = AttentionCall(pe, kernel.path, default_state(pe, q.shape[-2], k.shape[-2], q.device))
    for _ in range(2):
        torch.testing.assert_close(kernel(q, k, v, call), attend(q, k, v, pe, "math"), **TOLERANCE)
    assert calls == [1]  # given up after the first failure
    assert capsys.readouterr().err == (
        "warning: FlexAttention failed (RuntimeError: triton: no kernel for this GPU); attention runs sdpa "
        "(bias as a blockwise mask) from now on\n"
    )
    assert kernel.fallback.failure == "RuntimeError: triton: no kernel for this GPU"
    assert kernel.backend() == "sdpa"  # what the runs' records name
    assert choose_kernel(pe, "flex", cuda).backend() == "flex"  # another model's kernel is its own


def test_a_models_layers_share_one_fallback_and_record_what_runs(monkeypatch, capsys):
    """Every layer of a model that runs flex gives it up at the model's first failure (one warning), and the model's
    backend, which the runs' records read, is then sdpa; another model starts afresh."""

    def broken(*args):
        raise RuntimeError("triton: no kernel for this GPU")

    monkeypatch.setattr(kernels, "_flex_attention", broken)
    cfg = ModelConfig(n_layer=3, n_head=H, n_embd=H * D, vocab_size=50, attn_backend="flex")
    model = GPT(cfg, SCHEMES["alibi"].config_class(), train_seq_len=16)
    assert model.attention_backend(torch.device("cpu")) == "flex"
    with torch.no_grad():
        model(torch.randint(0, 50, (1, 16)))
    assert model.attention_backend(torch.device("cpu")) == "sdpa"
    assert capsys.readouterr().err.count("warning: FlexAttention failed") == 1
    model.resolve_attention_paths()  # chosen again (an evaluation-time variation): still given up
    assert model.attention_backend(torch.device("cpu")) == "sdpa"
    assert GPT(cfg, SCHEMES["alibi"].config_class(), train_seq_len=16).attention_backend(torch.device("cpu")) == "flex"


@pytest.mark.slow
@torch.no_grad()
def test_the_compiled_flex_kernel_serves_many_shapes_and_never_runs_unfused_silently(monkeypatch, capsys):
    """The compiled flex_attention that CUDA runs, through a layer's kernel (traced by dynamo as on CUDA; aot_eager in
    place of inductor, whose CPU template does not compile size-generic flex kernels): a task's lengths and
    evaluation's batch sizes compile a few size-generic graphs, not one per shape (dynamo's recompile limit, 8, would
    otherwise be reached, and dynamo would then run flex_attention unfused without a word); past the limit it raises,
    and the kernel gives FlexAttention up with one warning and runs sdpa, which the run records."""
    counter = CompileCounterWithBackend("aot_eager")
    monkeypatch.setattr(kernels, "_flex_function", lambda device: kernels._compiled_flex_attention(counter))
    pe = scheme("alibi")
    kernel = choose_kernel(pe, "flex", "cuda")
    shapes = [(2, 64), (1, 64), (3, 100), (2, 128), (1, 200), (4, 33), (2, 256), (5, 77), (2, 300), (3, 129)]

    def check(batch, length):
        generator = torch.Generator().manual_seed(length)
        q, k, v = (torch.randn(batch, H, length, D, generator=generator) for _ in range(3))
        call = AttentionCall(pe, kernel.path, default_state(pe, length, length, q.device))
        torch.testing.assert_close(kernel(q, k, v, call), attend(q, k, v, pe, "math"), **TOLERANCE)

    torch._dynamo.reset()
    for shape in shapes:
        check(*shape)
    assert kernel.fallback.failure is None and capsys.readouterr().err == ""
    assert counter.frame_count <= 5  # the first shape; then size-generic, with or without sizes of 1
    torch._dynamo.reset()
    monkeypatch.setattr(kernels, "FLEX_RECOMPILE_LIMIT", 1)
    for shape in shapes[:3]:
        check(*shape)
    torch._dynamo.reset()
    assert kernel.fallback.failure is not None and "recompile" in kernel.fallback.failure.lower()
    assert capsys.readouterr().err.count("warning: FlexAttention failed") == 1


def test_user_errors_from_flex_are_not_swallowed(capsys):
    pe, (q, k, v) = scheme("alibi"), qkv()
    kernel = choose_kernel(pe, "flex", "cpu")
    with pytest.raises(kernels.PosGPTError, match="cannot train on CPU"):
        kernel(q, k, v, AttentionCall(pe, kernel.path, default_state(pe, q.shape[-2], k.shape[-2], q.device)))
    assert kernel.fallback.failure is None and capsys.readouterr().err == ""
