"""The head + cross-entropy (model/loss.py): every path against F.cross_entropy over the real vocabulary.

The weight has padding rows past ``VOCAB`` (as the model pads 50,257 to 50,304); they are given large logits, so a
path that let them into the softmax would be off by far more than the tolerance.
"""

import pytest
import torch
import torch.nn.functional as F

import model.loss as loss_module
from model.loss import lm_head_cross_entropy

B, T, C, VOCAB, PADDED = 3, 11, 16, 130, 136
IGNORED = [(0, 0), (0, 1), (0, 2), (1, 7), (2, 10)]
FUSED_CHUNK = 4 * PADDED  # 4 rows per chunk: 33 rows make several chunks and a ragged last one


def inputs(ignore=(), seed=0, dtype=torch.float64):
    """float64 by default, so that a tolerance of 1e-6 checks the mathematics rather than rounding."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, C, generator=generator, dtype=dtype)
    weight = torch.randn(PADDED, C, generator=generator, dtype=dtype)
    weight[VOCAB:] = 5 * hidden.flatten(0, 1)[: PADDED - VOCAB]  # padding rows: logits of ~80 on some rows
    targets = torch.randint(0, VOCAB, (B, T), generator=generator)
    for b, t in ignore:
        targets[b, t] = -100
    return hidden.requires_grad_(), weight.requires_grad_(), targets


def reference(hidden, weight, targets, reduction):
    """F.cross_entropy over the logits sliced to the real vocabulary, in float64."""
    logits = (hidden.double() @ weight.double().t())[..., :VOCAB]
    losses = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction=reduction)
    return losses.view_as(targets) if reduction == "none" else losses


def ours(fused, chunk=None):
    return lambda h, w, t, reduction: lm_head_cross_entropy(
        h, w, t, reduction, vocab_size=VOCAB, fused=fused, chunk=chunk
    )


def loss_and_grads(fn, hidden, weight, targets, reduction, scale=2.5):
    """The loss and both gradients of scale * loss.sum() (the scale checks that backward uses the incoming one)."""
    hidden.grad = weight.grad = None
    loss = fn(hidden, weight, targets, reduction)
    (loss.sum() * scale).backward()
    return loss.detach().double(), hidden.grad.double(), weight.grad.double()


def assert_matches(got, want, names=("loss", "grad hidden", "grad weight")):
    for g, w, name in zip(got, want, names):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("ignore", [(), IGNORED], ids=["all-scored", "some-ignored"])
@pytest.mark.parametrize(
    "path, reduction",
    [
        ("fused", "mean"),
        ("fused", "sum"),
        ("plain", "mean"),
        ("plain", "sum"),
        ("plain", "none"),
    ],
)
def test_training_paths_match_cross_entropy_over_the_real_vocabulary(path, reduction, ignore):
    hidden, weight, targets = inputs(ignore)
    fn = ours("always", FUSED_CHUNK) if path == "fused" else ours("never")
    got = loss_and_grads(fn, hidden, weight, targets, reduction)
    assert_matches(got, loss_and_grads(reference, hidden, weight, targets, reduction))
    assert not got[2][VOCAB:].any()  # the padding rows get no gradient


@pytest.mark.parametrize("path", ["fused", "plain"])
def test_float32_training_paths_are_within_rounding_of_the_reference(path):
    hidden, weight, targets = inputs(IGNORED, dtype=torch.float32)
    got = loss_and_grads(ours("always" if path == "fused" else "never", FUSED_CHUNK), hidden, weight, targets, "mean")
    for g, w in zip(got, loss_and_grads(reference, hidden, weight, targets, "mean")):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_no_grad_chunked_path_matches_cross_entropy_over_the_real_vocabulary(reduction):
    hidden, weight, targets = inputs(IGNORED)
    with torch.inference_mode():
        got = lm_head_cross_entropy(hidden, weight, targets, reduction, vocab_size=VOCAB, chunk=5 * PADDED)
        want = reference(hidden, weight, targets, reduction)
    assert got.shape == want.shape
    assert_matches([got.double()], [want], names=("loss",))
    if reduction == "none":
        assert (got[targets == -100] == 0).all()


def test_the_padding_would_change_the_loss():
    """The test above can fail: over all 136 columns the loss differs from the real-vocabulary one by far more."""
    hidden, weight, targets = inputs()
    with torch.no_grad():
        padded = lm_head_cross_entropy(hidden, weight, targets)  # vocab_size defaults to every row
        assert (padded - lm_head_cross_entropy(hidden, weight, targets, vocab_size=VOCAB)).abs() > 1e-2


def test_fused_path_is_taken_and_saves_no_logits():
    hidden, weight, targets = inputs()
    loss = lm_head_cross_entropy(hidden, weight, targets, vocab_size=VOCAB, fused="always", chunk=FUSED_CHUNK)
    assert type(loss.grad_fn).__name__ == "_FusedLinearCrossEntropyBackward"
    saved = [t.numel() for t in loss.grad_fn.saved_tensors]
    assert max(saved) == PADDED * C  # the gradients, never a (rows, V) tensor


def test_fused_when_every_target_is_ignored():
    hidden, weight, targets = inputs([(b, t) for b in range(B) for t in range(T)])
    loss = lm_head_cross_entropy(hidden, weight, targets, vocab_size=VOCAB, fused="always")
    assert torch.isnan(loss) and torch.isnan(reference(hidden, weight, targets, "mean"))  # 0/0, as torch
    loss.backward()
    assert not hidden.grad.any() and not weight.grad.any()


def test_fused_large_logits_are_stable():
    hidden, weight, targets = inputs(dtype=torch.float32)
    with torch.no_grad():
        weight.mul_(200.0)  # logits of several thousand: a naive exp() overflows
    got = loss_and_grads(ours("always", FUSED_CHUNK), hidden, weight, targets, "mean")
    want = loss_and_grads(reference, hidden, weight, targets, "mean")
    assert torch.isfinite(got[0])
    for g, w in zip(got, want):  # float32 rounding of logits ~1e4 against the float64 reference
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-3)


def test_fused_under_bf16_autocast_matches_plain_autocast_path():
    hidden, weight, targets = inputs(IGNORED, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = loss_and_grads(ours("always", FUSED_CHUNK), hidden, weight, targets, "mean")
        want = loss_and_grads(ours("never"), hidden, weight, targets, "mean")
    assert hidden.grad.dtype == hidden.dtype and weight.grad.dtype == weight.dtype
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-3)


def test_auto_fuses_on_cpu_only_and_other_modes_are_refused():
    assert loss_module.use_fused("auto", torch.device("cpu"))
    assert not loss_module.use_fused("auto", torch.device("cuda"))
    assert loss_module.use_fused("always", torch.device("cuda"))
    assert not loss_module.use_fused("never", torch.device("cpu"))
    with pytest.raises(ValueError, match="fused must be one of"):
        loss_module.use_fused("sometimes", torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_on_cuda_under_bf16_autocast_matches_plain():
    hidden, weight, targets = (
        t.detach().cuda().requires_grad_(t.requires_grad) for t in inputs(IGNORED, dtype=torch.float32)
    )
    results = []
    for mode in ("always", "never"):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            results.append(loss_and_grads(ours(mode), hidden, weight, targets, "mean"))
    for g, w in zip(*results):
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-3)
