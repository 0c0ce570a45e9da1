"""The fused chunked head + cross-entropy (model/loss.py) against F.cross_entropy on the full logits."""

import pytest
import torch
import torch.nn.functional as F

import model.loss as loss_module
from model.loss import lm_head_cross_entropy

B, T, C, V = 3, 11, 16, 130


@pytest.fixture
def fused(monkeypatch):
    """Force the fused path, with chunks of 4 rows so that 33 rows make several chunks and a ragged last one."""
    monkeypatch.setattr(loss_module, "FUSED", "always")
    monkeypatch.setattr(loss_module, "FUSED_CHUNK", 4 * V)


def inputs(ignore=(), seed=0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, C, generator=generator, requires_grad=True)
    weight = torch.randn(V, C, generator=generator, requires_grad=True)
    targets = torch.randint(0, V, (B, T), generator=generator)
    for b, t in ignore:
        targets[b, t] = -100
    return hidden, weight, targets


def reference(hidden, weight, targets, reduction):
    return F.cross_entropy((hidden @ weight.t()).flatten(0, 1), targets.flatten(), ignore_index=-100,
                           reduction=reduction)


def loss_and_grads(fn, hidden, weight, targets, reduction, scale=1.0):
    hidden.grad = weight.grad = None
    loss = fn(hidden, weight, targets, reduction)
    (loss * scale).backward()
    return loss.detach(), hidden.grad.clone(), weight.grad.clone()


IGNORED = [(0, 0), (0, 1), (0, 2), (1, 7), (2, 10)]


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("ignore", [(), IGNORED], ids=["all-scored", "some-ignored"])
def test_fused_forward_and_backward_match_cross_entropy(fused, reduction, ignore):
    hidden, weight, targets = inputs(ignore)
    # a scale on the loss checks that backward multiplies by the incoming gradient
    got = loss_and_grads(lm_head_cross_entropy, hidden, weight, targets, reduction, scale=2.5)
    want = loss_and_grads(reference, hidden, weight, targets, reduction, scale=2.5)
    for g, w, name in zip(got, want, ("loss", "grad hidden", "grad weight")):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_fused_path_is_taken_and_saves_no_logits(fused):
    hidden, weight, targets = inputs()
    loss = lm_head_cross_entropy(hidden, weight, targets)
    assert type(loss.grad_fn).__name__ == "_FusedLinearCrossEntropyBackward"
    saved = [t.numel() for t in loss.grad_fn.saved_tensors]
    assert max(saved) == V * C  # the gradients, never a (rows, V) tensor


def test_fused_when_every_target_is_ignored(fused):
    hidden, weight, targets = inputs([(b, t) for b in range(B) for t in range(T)])
    loss = lm_head_cross_entropy(hidden, weight, targets)
    assert torch.isnan(loss) and torch.isnan(reference(hidden, weight, targets, "mean"))  # 0/0, as torch
    loss.backward()
    assert not hidden.grad.any() and not weight.grad.any()


def test_fused_large_logits_are_stable(fused):
    hidden, weight, targets = inputs()
    with torch.no_grad():
        weight.mul_(200.0)  # logits of several thousand: a naive exp() overflows
    got = loss_and_grads(lm_head_cross_entropy, hidden, weight, targets, "mean")
    want = loss_and_grads(reference, hidden, weight, targets, "mean")
    assert torch.isfinite(got[0])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_fused_under_bf16_autocast_matches_plain_autocast_path(fused, monkeypatch):
    hidden, weight, targets = inputs(IGNORED)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = loss_and_grads(lm_head_cross_entropy, hidden, weight, targets, "mean")
    monkeypatch.setattr(loss_module, "FUSED", "never")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = loss_and_grads(lm_head_cross_entropy, hidden, weight, targets, "mean")
    assert got[1].dtype == hidden.dtype and got[2].dtype == weight.dtype
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-3)


def test_reduction_none_without_grad_is_exact_per_token_loss(monkeypatch):
    monkeypatch.setattr(loss_module, "NO_GRAD_CHUNK", 5 * V)  # several chunks
    hidden, weight, targets = inputs(IGNORED)
    with torch.inference_mode():
        got = lm_head_cross_entropy(hidden, weight, targets, "none")
        want = reference(hidden, weight, targets, "none").view(B, T)
        mean = lm_head_cross_entropy(hidden, weight, targets, "mean")
    assert got.shape == (B, T)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    assert (got[targets == -100] == 0).all()
    torch.testing.assert_close(mean, reference(hidden, weight, targets, "mean"), rtol=1e-6, atol=0)


def test_reduction_none_with_grad_uses_the_plain_path(fused):
    hidden, weight, targets = inputs(IGNORED)
    got = loss_and_grads(lambda *a: lm_head_cross_entropy(*a).sum(), hidden, weight, targets, "none")
    want = loss_and_grads(lambda *a: reference(*a).sum(), hidden, weight, targets, "none")
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_auto_fuses_on_cpu_only(monkeypatch):
    monkeypatch.setattr(loss_module, "FUSED", "auto")
    assert loss_module.use_fused(torch.device("cpu"))
    assert not loss_module.use_fused(torch.device("cuda"))
    monkeypatch.setattr(loss_module, "FUSED", "sometimes")
    with pytest.raises(ValueError, match="FUSED"):
        loss_module.use_fused(torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_on_cuda_under_bf16_autocast_matches_plain(monkeypatch):
    hidden, weight, targets = (t.detach().cuda().requires_grad_(t.requires_grad) for t in inputs(IGNORED))
    results = []
    for mode in ("always", "never"):
        monkeypatch.setattr(loss_module, "FUSED", mode)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            results.append(loss_and_grads(lm_head_cross_entropy, hidden, weight, targets, "mean"))
    for g, w in zip(*results):
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-3)
