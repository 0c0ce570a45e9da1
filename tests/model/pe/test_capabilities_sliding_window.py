"""A sliding window (model/pe/capabilities.py, ``SlidingWindow``): query i attends key j where i - W < j <= i, on
every attention path, each checked against the dense formula written out here with an explicit window mask, at
lengths around the window (1, W, W + 1, 3W + 5) and across FlexAttention's blocks of 128; alone and inside a per-layer
pattern; decoding from a KV cache and streaming (evaluation/streaming.py's cache)."""

import math

import pytest
import torch

import model.attention as attention
import model.kernels as kernels
from evaluation.streaming import StreamingCache
from model import GPT, KVCache, ModelConfig
from model.kernels import attend, resolve_path
from model.pe import SCHEMES, ModelDims, PositionState, build_positional_encoding
from model.pe.capabilities import SlidingWindow

B, H, D = 2, 2, 8
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def windowed(window: int, train_seq_len: int = 64):
    dims = ModelDims(n_embd=H * D, n_head=H, head_dim=D, train_seq_len=train_seq_len, init_std=0.02, n_layer=2)
    return build_positional_encoding(SCHEMES["swa_rope"].config_class(window=window), dims)


def reference(q, k, v, window, q_offset=0, sink=None, documents=None):
    """softmax(q k^T / sqrt(d) + mask) v, float64, the mask keeping i - W < j <= i (and one document, and a sink
    logit in the denominator), written out whole."""
    q, k, v = q.double(), k.double(), v.double()
    i = torch.arange(q_offset, q_offset + q.shape[-2])[:, None]
    j = torch.arange(k.shape[-2])[None, :]
    visible = (j <= i) & (j > i - window)
    if documents is not None:
        visible = visible & (documents[:, i] == documents[:, j])[:, None]
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~visible, float("-inf"))
    if sink is None:
        return torch.softmax(scores, dim=-1) @ v
    column = sink.double()[None, :, None, None].expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat((column, scores), dim=-1), dim=-1)[..., 1:] @ v


def qkv(tq, tk, seed=0, requires_grad=False):
    """Without gradients by default: FlexAttention on a CPU refuses inputs that require them."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, t, D, generator=generator, requires_grad=requires_grad) for t in (tq, tk, tk)]


@pytest.fixture(autouse=True)
def flex_runs(capsys):
    """Every flex case here must run FlexAttention itself: one that failed would have run sdpa in its place (the
    layer's Fallback, model/fallback.py), and its comparison would pass on sdpa's numbers."""
    yield
    assert "FlexAttention failed" not in capsys.readouterr().err, "sdpa ran instead"


W = 8
LENGTHS = [1, W, W + 1, 3 * W + 5]


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("backend", ["sdpa", "math"])
@pytest.mark.parametrize("blocks", [False, True])
def test_every_path_equals_the_written_out_window_forward_and_backward(backend, length, blocks, monkeypatch):
    if blocks:  # sdpa's mask blocks and the written-out path's blocks of queries: a few queries each
        monkeypatch.setattr(attention, "_MAX_BLOCK_SCORES", 3 * B * H * length)
        monkeypatch.setattr(attention, "_RECOMPUTED_BLOCK", 3)
    pe, (q, k, v) = windowed(W), qkv(length, length, requires_grad=True)
    out = attend(q, k, v, pe, backend)
    want = reference(q, k, v, W)
    torch.testing.assert_close(out.double(), want, **TOLERANCE)
    got = torch.autograd.grad(out.square().sum(), (q, k, v))
    expected = torch.autograd.grad(want.square().sum(), (q, k, v))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e.float(), **TOLERANCE)


@pytest.mark.parametrize(("length", "window"), [(n, W) for n in LENGTHS] + [(300, 100), (257, 128), (300, 129)])
@torch.no_grad()
def test_flex_equals_the_written_out_window(length, window):
    pe, (q, k, v) = windowed(window), qkv(length, length)
    torch.testing.assert_close(attend(q, k, v, pe, "flex").double(), reference(q, k, v, window), **TOLERANCE)


@pytest.mark.parametrize("length", [1, 2, 8, 9, 29, 127, 128, 129, 300, 520])
@pytest.mark.parametrize("window", [1, 8, 100, 128, 129, 300])
def test_the_window_block_mask_is_create_block_masks_without_its_dense_mask(length, window):
    from torch.nn.attention.flex_attention import create_block_mask

    ours = kernels._make_causal_block_mask(length, "cpu", window)
    mask_mod = kernels.sliding_window_mask(window)
    theirs = create_block_mask(mask_mod, B=None, H=None, Q_LEN=length, KV_LEN=length, device="cpu")
    for field in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
        assert torch.equal(getattr(ours, field), getattr(theirs, field)), field
    for field in ("q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"):
        assert torch.equal(getattr(ours, field), getattr(theirs, field)), field
    assert torch.equal(ours.to_dense(), theirs.to_dense())


@pytest.mark.parametrize("backend", ["sdpa", "math", "flex"])
@pytest.mark.parametrize(("n_queries", "n_keys"), [(1, 1), (1, W), (1, W + 1), (3, 3 * W + 5), (5, 300)])
@torch.no_grad()
def test_queries_after_cached_keys_see_the_window_by_their_index(backend, n_queries, n_keys):
    pe, (q, k, v) = windowed(W), qkv(n_queries, n_keys)
    want = reference(q, k, v, W, q_offset=n_keys - n_queries)
    torch.testing.assert_close(attend(q, k, v, pe, backend).double(), want, **TOLERANCE)


@pytest.mark.parametrize("backend", ["sdpa", "math", "flex"])
@pytest.mark.parametrize(("n_queries", "n_keys"), [(W + 1, W + 1), (3 * W + 5, 3 * W + 5), (2, 3 * W + 5)])
@torch.no_grad()
def test_a_sink_logit_stays_in_the_denominator_within_a_window(backend, n_queries, n_keys):
    pe, (q, k, v) = windowed(W), qkv(n_queries, n_keys)
    sink = torch.randn(H, generator=torch.Generator().manual_seed(3))
    out = attend(q, k, v, pe, backend, sink=sink)
    torch.testing.assert_close(out.double(), reference(q, k, v, W, n_keys - n_queries, sink), **TOLERANCE)


@pytest.mark.parametrize("backend", ["sdpa", "math", "flex"])
@torch.no_grad()
def test_packed_documents_and_the_window_both_mask(backend):
    length = 3 * W + 5
    pe, (q, k, v) = windowed(W), qkv(length, length)
    documents = torch.tensor([[0] * 5 + [1] * 20 + [2] * 4, [0] * 14 + [1] * 15])
    positions = torch.arange(length).expand(B, length)  # only the mask matters to the window's scheme here
    state = PositionState(positions, positions, 0, None, explicit=True, documents=documents)
    want = reference(q, k, v, W, documents=documents)
    torch.testing.assert_close(attend(q, k, v, pe, backend, state=state).double(), want, **TOLERANCE)


def test_the_path_reads_the_window_and_refuses_merged_rotations():
    pe = windowed(5)
    assert isinstance(pe, SlidingWindow)
    for device in ("cpu", "cuda"):
        assert resolve_path(pe, "auto", device).sliding_window == 5
    assert resolve_path(pe, "auto", "cuda").runs == "flex"  # the block mask skips the blocks outside the window
    assert resolve_path(pe, "auto", "cpu").runs == "sdpa"
    assert "sliding window 5" in resolve_path(pe, "sdpa", "cpu").describe()
    assert resolve_path(windowed(5), "sdpa", "cpu", sink=True).sliding_window == 5


# -- Through the model: alone, inside a pattern, decoding, streaming --

VOCAB = 53


def model(pe_name: str, backend: str = "math", **settings) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=4, n_head=H, n_embd=H * D, vocab_size=VOCAB, attn_backend=backend, init_std=0.2)
    return GPT(cfg, SCHEMES[pe_name].config_class(**settings), train_seq_len=16)


PATTERNS = [
    ("swa_rope", {"window": 5}),
    ("hybrid", {"pattern": ["swa_rope", "none"], "swa_rope": SCHEMES["swa_rope"].config_class(window=5)}),
    ("hybrid", {"pattern": ["alibi", "swa_rope"], "swa_rope": SCHEMES["swa_rope"].config_class(window=5)}),
    ("swan", {}),
]


@pytest.mark.parametrize(("pe_name", "settings"), PATTERNS)
def test_model_paths_equal_the_written_out_one_forward_and_backward(pe_name, settings):
    idx = torch.randint(0, VOCAB, (2, 29), generator=torch.Generator().manual_seed(1))
    want = model(pe_name, "math", **settings)
    loss = want(idx, idx)
    loss.backward()
    for backend in ("sdpa", "auto"):
        got = model(pe_name, backend, **settings)
        other = got(idx, idx)
        other.backward()
        torch.testing.assert_close(other, loss, **TOLERANCE)
        for (name, p), (_, r) in zip(got.named_parameters(), want.named_parameters()):
            torch.testing.assert_close(p.grad, r.grad, **TOLERANCE, msg=lambda m, name=name: f"{name}: {m}")
    with torch.no_grad():
        flex = model(pe_name, "flex", **settings)
        torch.testing.assert_close(flex(idx), want(idx), **TOLERANCE)


@pytest.mark.parametrize(("pe_name", "settings"), PATTERNS)
@pytest.mark.parametrize("backend", ["sdpa", "math"])
@torch.inference_mode()
def test_decoding_from_a_kv_cache_equals_a_full_forward(pe_name, settings, backend):
    net = model(pe_name, backend, **settings)
    idx = torch.randint(0, VOCAB, (2, 29), generator=torch.Generator().manual_seed(2))
    cache = KVCache()
    steps = [net(idx[:, :3], cache=cache)] + [net(idx[:, t : t + 1], cache=cache) for t in range(3, idx.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), net(idx), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("sinks", [0, 2])
@torch.inference_mode()
def test_streaming_with_a_cache_as_long_as_the_window_is_the_full_forward(sinks):
    """Every layer a window of W: a streaming cache holding the W most recent tokens (and sinks before them) gives
    each query the keys it has in a full forward pass, each computed from the same context; the cache's re-indexed
    positions shift RoPE's angles of query and key alike, which leaves q . k as it was."""
    window = 5
    net = model("swa_rope", "sdpa", window=window)
    idx = torch.randint(0, VOCAB, (2, 31), generator=torch.Generator().manual_seed(4))
    cache = StreamingCache(sinks=sinks, window=window)
    steps = torch.cat([net(idx[:, t : t + 1], cache=cache) for t in range(idx.shape[1])], dim=1)
    torch.testing.assert_close(steps, net(idx), rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_a_window_longer_than_the_sequence_is_plain_causal_attention():
    idx = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(5))
    rope = model("rope")
    wide = model("swa_rope", window=20)
    wide.load_state_dict(rope.state_dict())
    torch.testing.assert_close(wide(idx), rope(idx), **TOLERANCE)
    narrow = model("swa_rope", window=4)
    narrow.load_state_dict(rope.state_dict())
    assert not torch.allclose(narrow(idx)[:, 4:], rope(idx)[:, 4:])
    torch.testing.assert_close(narrow(idx)[:, :4], rope(idx)[:, :4], **TOLERANCE)  # within the window: the same
