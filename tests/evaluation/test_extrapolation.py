"""The evaluation protocols, checked against brute force: full forwards of every window, by hand."""

import math

import numpy as np
import pytest
import torch
from protocol_cases import Tokens, brute_force, tiny

from evaluation.extrapolation import (
    MIN_BIN_TOKENS,
    _device_batch,
    effective_stride,
    evaluate_extrapolation,
    position_bins,
    score_windows,
    scored_range,
    window_plan,
)

CPU = torch.device("cpu")


def targets_scored(plan, n_tokens):
    """Every (target index, window position) the plan scores; checks windows stay inside the split."""
    scored = []
    for w in plan:
        assert 0 <= w.start and w.start + w.length + 1 <= n_tokens
        scored += [(w.start + 1 + p, p) for p in range(w.first_scored, w.length)]
    return scored


@pytest.mark.parametrize("length", [4, 6, 8, 16])
@pytest.mark.parametrize(
    "protocol, stride", [("nonoverlapping", None), ("sliding", None), ("sliding", 1), ("sliding", 3), ("sliding", 100)]
)
def test_every_target_is_scored_exactly_once_with_the_promised_context(length, protocol, stride):
    first, n = scored_range(1000, [4, 6, 8, 16], max_tokens=200)
    assert (first, n) == (16, 192)  # the longest length, and N the largest multiple of it within 200
    scored = targets_scored(window_plan(first, n, length, protocol, stride), 1000)
    assert sorted(t for t, _ in scored) == list(range(first, first + n))
    if protocol == "sliding":  # at window position >= L - S: predicted from at least L - S + 1 tokens
        assert min(position for _, position in scored) == length - effective_stride(length, stride)
    else:  # every window position; with L not dividing N the last window is shorter
        assert sorted({position for _, position in scored}) == list(range(length))


def test_scored_range_leaves_out_lengths_that_do_not_fit():
    assert scored_range(100, [16, 64], max_tokens=1000) == (16, 80)  # 64 needs 128 tokens in the split
    assert scored_range(1000, [16, 64], max_tokens=40) == (16, 32)  # and max_tokens >= 64
    assert scored_range(20, [16], max_tokens=1000) is None


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_stride_one_equals_brute_force(name):
    """Stride 1: every target is predicted from the L tokens before it, computed here one target at a time."""
    model, tokens, L = tiny(name), Tokens(200), 8
    first, n = scored_range(len(tokens), [L], max_tokens=24)
    result = score_windows(model, tokens, window_plan(first, n, L, "sliding", 1), 64, CPU, torch.float32)
    expected = brute_force(model, tokens, [(t, L) for t in range(first, first + n)])
    assert result["tokens"] == n == 24
    assert result["loss"] == pytest.approx(np.mean(expected), rel=1e-5)
    assert result["ppl"] == pytest.approx(math.exp(np.mean(expected)), rel=1e-5)
    # only the last position of each window is scored
    assert result["per_position_loss"][:-1] == [None] * (L - 1)
    assert result["per_position_loss"][-1] == pytest.approx(np.mean(expected), rel=1e-5)


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_default_stride_equals_brute_force(name):
    """Stride L/2 (the default), the last window scoring fewer: with the head computed only where a window
    scores (``score_from``), every target gets the loss it has with its window's tokens before it."""
    model, tokens, L = tiny(name), Tokens(200), 8
    first = L
    plan = window_plan(first, 22, L, "sliding")
    assert [w.first_scored for w in plan][-2:] == [L // 2, L - 2]
    result = score_windows(model, tokens, plan, 64, CPU, torch.float32)
    pairs = [(w.start + p + 1, p + 1) for w in plan for p in range(w.first_scored, L)]
    assert [t for t, _ in pairs] == list(range(first, first + 22))
    expected = brute_force(model, tokens, pairs)
    assert result["tokens"] == 22
    assert result["loss"] == pytest.approx(np.mean(expected), rel=1e-5)


def test_score_from_scores_the_same_positions_without_the_head_before_them():
    model, tokens = tiny("rope"), Tokens(200)
    x = torch.from_numpy(np.stack([tokens.read(i, 12).astype(np.int64) for i in (0, 20)]))
    y = torch.roll(x, -1, 1)
    full = model(x, y, reduction="none")
    assert torch.allclose(model(x, y, reduction="none", score_from=5), full[:, 5:], rtol=1e-5, atol=1e-6)
    assert model(x, y, score_from=5).item() == pytest.approx(full[:, 5:].mean().item(), rel=1e-5)


def test_nonoverlapping_and_per_position_equal_brute_force():
    model, tokens, L = tiny(), Tokens(200), 8
    first, n = scored_range(len(tokens), [L], max_tokens=32)
    result = score_windows(model, tokens, window_plan(first, n, L, "nonoverlapping"), 16, CPU, torch.float32)
    windows = [(first + w * L, first + (w + 1) * L) for w in range(n // L)]
    by_position = [brute_force(model, tokens, [(start + p, p + 1) for start, _ in windows]) for p in range(L)]
    assert result["tokens"] == n
    assert result["loss"] == pytest.approx(np.mean(by_position), rel=1e-5)
    assert result["per_position_loss"] == pytest.approx([np.mean(v) for v in by_position], rel=1e-5)


def test_sliding_with_stride_length_equals_nonoverlapping():
    model, tokens, L = tiny(), Tokens(400), 8
    first, n = scored_range(len(tokens), [L], max_tokens=64)
    a = score_windows(model, tokens, window_plan(first, n, L, "nonoverlapping"), 64, CPU, torch.float32)
    b = score_windows(model, tokens, window_plan(first, n, L, "sliding", L), 64, CPU, torch.float32)
    assert a["tokens"] == b["tokens"]
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-9)
    assert a["per_position_loss"] == pytest.approx(b["per_position_loss"], rel=1e-9)


def test_batching_does_not_change_results():
    model, tokens, L = tiny("alibi"), Tokens(400), 8
    plan = window_plan(*scored_range(len(tokens), [L], 64), L, "sliding", 3)
    one_per_batch = score_windows(model, tokens, plan, L, CPU, torch.float32)
    all_in_one = score_windows(model, tokens, plan, 10_000, CPU, torch.float32)
    assert one_per_batch["loss"] == pytest.approx(all_in_one["loss"], rel=1e-6)


def test_all_lengths_and_protocols_score_the_same_tokens():
    rows = evaluate_extrapolation(
        tiny("alibi"),
        Tokens(500),
        [8, 12, 16, 32],
        ["nonoverlapping", "sliding"],
        stride=None,
        max_tokens=100,
        batch_tokens=64,
        device=CPU,
        dtype=torch.float32,
        progress=False,
    )
    assert len(rows) == 8
    assert {row["tokens"] for row in rows} == {96}  # 3 windows of the longest length, 32
    assert {tuple(row["target_range"]) for row in rows} == {(32, 128)}
    for row in rows:
        assert len(row["per_position_loss"]) == row["length"]
        assert row["stride"] == (row["length"] // 2 if row["protocol"] == "sliding" else None)
        assert row["peak_memory_mb"] > 0 and row["memory_metric"].startswith("cpu")


def test_learned_beyond_its_table_is_reported_not_evaluated():
    rows = evaluate_extrapolation(
        tiny("learned"), Tokens(300), [8, 16], ["nonoverlapping"], None, 64, 64, CPU, torch.float32, progress=False
    )
    assert rows[0]["ppl"] is not None and "reason" not in rows[0]
    assert rows[1]["ppl"] is None and rows[1]["loss"] is None and "at most 8 positions" in rows[1]["reason"]


def test_lengths_the_data_cannot_hold_are_reported():
    rows = evaluate_extrapolation(
        tiny(), Tokens(40), [8, 32], ["sliding"], None, 64, 64, CPU, torch.float32, progress=False
    )
    assert rows[0]["ppl"] is not None
    assert rows[1]["ppl"] is None and "tokens in the split" in rows[1]["reason"]


def test_padded_rows_score_nothing():
    """On CUDA a short last batch is padded to the full batch shape; the padding must not count."""
    model, tokens, L = tiny(), Tokens(200), 8
    plan = window_plan(*scored_range(len(tokens), [L], 32), L, "sliding", 2)[:3]
    x, y = _device_batch(tokens, plan, 5, CPU)
    assert x.shape == y.shape == (5, L) and (y[3:] == -100).all()
    padded = model(x, y, reduction="none")
    unpadded = model(*_device_batch(tokens, plan, 3, CPU), reduction="none")
    torch.testing.assert_close(padded[:3], unpadded)
    assert (padded[3:] == 0).all()


def test_position_bins_partition_the_positions_and_keep_every_token():
    """32 windows of 1,024 (16x at the default max_tokens): log-spaced bins merged to >= MIN_BIN_TOKENS each."""
    rng = np.random.default_rng(0)
    counts = [32.0] * 1024
    sums = (rng.uniform(2, 5, 1024) * 32).tolist()
    bins = position_bins(sums, counts)
    edges = [b["positions"] for b in bins]
    assert edges[0][0] == 1 and edges[-1][1] == 1025 and all(a[1] == b[0] for a, b in zip(edges, edges[1:]))
    assert sum(b["tokens"] for b in bins) == 32 * 1024
    assert all(b["tokens"] >= MIN_BIN_TOKENS for b in bins)
    for b in bins:
        lo, hi = b["positions"]
        assert b["tokens"] == 32 * (hi - lo) and b["loss"] == pytest.approx(sum(sums[lo - 1 : hi - 1]) / b["tokens"])
    assert sum(b["loss"] * b["tokens"] for b in bins) == pytest.approx(sum(sums))
    assert 10 <= len(bins) <= 20 and edges[-1][1] / edges[-1][0] == pytest.approx(2**0.25, rel=0.02)


def test_position_bins_are_log_spaced_and_skip_unscored_positions():
    bins = position_bins([1.0] * 64, [1.0] * 64, min_tokens=1)  # no merging: the log-spaced edges themselves
    assert [b["positions"] for b in bins][:4] == [[1, 2], [2, 3], [3, 4], [4, 5]]
    assert [b["positions"] for b in bins][-2:] == [[47, 55], [55, 65]]  # 65^(23/25) = 46.6, 65^(24/25) = 54.9
    # sliding at stride 32: positions 1-32 never scored; [33, 39) (60 tokens) needs [39, 47) to reach 100,
    # and [47, 55) (80) needs [55, 65)
    sliding = position_bins([0.0] * 32 + [3.0] * 32, [0.0] * 32 + [10.0] * 32, min_tokens=100)
    assert [b["positions"] for b in sliding] == [[33, 47], [47, 65]]
    assert [b["tokens"] for b in sliding] == [140, 180] and {b["loss"] for b in sliding} == {0.3}
    few = position_bins([2.0] * 8, [1.0] * 8)  # fewer tokens than one bin needs: one bin, with its count
    assert few == [{"positions": [1, 9], "loss": 2.0, "tokens": 8}]


def test_score_windows_bins_pool_the_per_position_losses():
    model, tokens, L = tiny(), Tokens(400), 16
    first, n = scored_range(len(tokens), [L], max_tokens=96)
    result = score_windows(model, tokens, window_plan(first, n, L, "nonoverlapping"), 64, CPU, torch.float32)
    bins = result["per_position_bins"]
    assert sum(b["tokens"] for b in bins) == result["tokens"] == 96  # 6 windows, 16 bins merged into one
    assert sum(b["loss"] * b["tokens"] for b in bins) / 96 == pytest.approx(result["loss"], rel=1e-9)
    for b in position_bins_of(result, min_tokens=1):
        lo, hi = b["positions"]
        assert b["loss"] == pytest.approx(np.mean(result["per_position_loss"][lo - 1 : hi - 1]), rel=1e-9)


def position_bins_of(result, min_tokens):
    """Re-bin a result's per-position means (nonoverlapping, L | N: every position has the same count)."""
    per_position = result["per_position_loss"]
    return position_bins(per_position, [1.0] * len(per_position), min_tokens)
