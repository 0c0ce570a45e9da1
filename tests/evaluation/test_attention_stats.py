"""Attention diagnostics (evaluation/attention_stats.py, scripts/inspect_attention.py): the captured
probabilities, the distance decomposition, the statistics' definitions, and the files the script writes."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from cli_runs import Runner, load_script
from tiny_checkpoint import make_run

from core.errors import PosGPTError
from data import TokenArray
from evaluation import attention_stats
from evaluation.attention_stats import (
    LayerSums,
    LengthStats,
    attention_statistics,
    log_bins,
    read_attention,
    weights_by_distance,
)
from model import GPT, ModelConfig
from model.pe import SCHEMES
from model.pe.alibi import alibi_slopes

SEQ_LEN = 16
CPU = torch.device("cpu")


def tiny(name: str, n_head: int = 2, init_std: float = 0.3) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=n_head, n_embd=8 * n_head, vocab_size=300, init_std=init_std)
    return GPT(cfg, SCHEMES[name].config_class(), train_seq_len=SEQ_LEN).eval()


def token_array(tmp_path, n: int) -> TokenArray:
    path = tmp_path / "tokens.bin"
    np.random.default_rng(0).integers(0, 300, n, dtype=np.uint16).tofile(path)
    return TokenArray([path])


@pytest.mark.parametrize("name", sorted(SCHEMES))
@torch.no_grad()
def test_captured_rows_by_distance_keep_each_rows_weight_over_the_distances_they_see(name):
    model = tiny(name)
    T = min(4 * SEQ_LEN, model.pe.max_positions() or 4 * SEQ_LEN)  # past the training length where possible
    idx = torch.randint(0, 300, (2, T))
    probs = []
    captured = model(idx, capture=probs)
    torch.testing.assert_close(captured, model(idx))  # capturing changes nothing
    assert len(probs) == 2 and all(p.shape == (2, 2, T, T) and p.dtype == torch.float32 for p in probs)
    for p in probs:
        weights = weights_by_distance(p)
        if "weights" in getattr(model.pe, "modifies", ()):  # weights other than a softmax: a row sums to at most 1
            torch.testing.assert_close(weights.sum(-1), p.sum(-1))
            assert (p.sum(-1) <= 1 + 1e-6).all()
        else:
            torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, T))
        i, d = torch.arange(T)[:, None], torch.arange(T)[None, :]
        assert (weights[..., d > i] == 0).all()
        assert weights[0, 1, 9, 4] == p[0, 1, 9, 5]  # query 9, distance 4: key 5


def test_weights_by_distance_of_cached_queries():
    """Queries that are the last Tq of Tk keys (a KV cache) see distances up to their own position."""
    probs = torch.softmax(
        torch.randn(1, 1, 3, 6).masked_fill(torch.arange(6)[None, :] > torch.arange(3, 6)[:, None], float("-inf")),
        dim=-1,
    )
    weights = weights_by_distance(probs)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 1, 3))
    assert weights[0, 0, 0, 3] == probs[0, 0, 0, 0] and (weights[0, 0, 0, 4:] == 0).all()


def test_uniform_attention_gives_the_uniform_entropy_and_mean_weights():
    """Rows attending uniformly to their i + 1 keys: entropy ln(i + 1), weight at distance d = E_{i>=d} 1/(i+1)."""
    T = 40
    rows = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]
    sums = LayerSums.zeros(1, T)
    sums.add(rows[None, None].expand(3, 1, T, T))
    report = LengthStats(T, [sums]).report()
    np.testing.assert_allclose(report["entropy"][0][0], report["uniform_entropy"], rtol=1e-6)
    first_bin, last_bin = report["distance_bins"][0], report["distance_bins"][-1]
    assert first_bin == [0, 1] and last_bin[1] == T
    np.testing.assert_allclose(report["mean_weight"][0][0][0], np.mean(1 / np.arange(1, T + 1)), rtol=1e-6)
    lo, hi = last_bin
    expected = np.mean([1 / (i + 1) for d in range(lo, hi) for i in range(d, T)])
    np.testing.assert_allclose(report["mean_weight"][0][0][-1], expected, rtol=1e-6)
    np.testing.assert_allclose(report["mean_distance"][0][0], np.mean([i / 2 for i in range(T)]), rtol=1e-6)


def test_rows_that_attend_less_than_everything_are_described_by_their_attended_part():
    """Weights that are not a softmax (stick-breaking) may sum to less than 1: entropy and mean distance are those of
    the row normalised to 1, and the attended mass is reported; a row that attends nothing adds mass 0, no NaN."""
    T = 16
    uniform = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]
    half = uniform * 0.5
    half[3] = 0  # query 3 attends nothing
    whole, partial = LayerSums.zeros(1, T), LayerSums.zeros(1, T)
    whole.add(uniform[None, None])
    partial.add(half[None, None])
    full, part = LengthStats(T, [whole]).report(), LengthStats(T, [partial]).report()
    assert full["attended_mass"][0][0] == pytest.approx([1.0] * len(full["position_bins"]))
    bin_of_3 = next(k for k, (lo, hi) in enumerate(part["position_bins"]) if lo <= 4 < hi)
    lo, hi = part["position_bins"][bin_of_3]
    for k, mass in enumerate(part["attended_mass"][0][0]):
        assert mass == pytest.approx(0.5 * (1 - 1 / (hi - lo)) if k == bin_of_3 else 0.5)
    entropies, uniform_entropies = np.array(part["entropy"][0][0]), np.array(full["entropy"][0][0])
    assert np.isfinite(entropies).all()
    others = [k for k in range(len(entropies)) if k != bin_of_3]
    np.testing.assert_allclose(entropies[others], uniform_entropies[others], rtol=1e-6)
    want = (np.arange(T) / 2).sum() - 3 / 2  # each row's normalised mean distance i / 2, row 3's left out
    np.testing.assert_allclose(part["mean_distance"][0][0], want / T, rtol=1e-6)


def test_log_bins_cover_every_integer_once():
    for n in (1, 2, 16, 1000):
        bins = log_bins(n)
        assert bins[0][0] == 1 and bins[-1][1] == n + 1
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(bins, bins[1:]))


def test_alibi_heads_with_steeper_slopes_look_closer(tmp_path):
    model = tiny("alibi", n_head=8, init_std=0.02)
    stats = attention_statistics(model, token_array(tmp_path, 4 * 8 * SEQ_LEN), 8 * SEQ_LEN, 2, CPU, torch.float32)
    slopes = alibi_slopes(8)
    for layer in stats["mean_distance"]:
        by_slope = [distance for _, distance in sorted(zip(slopes, layer))]  # from the smallest slope up
        assert all(a > b for a, b in zip(by_slope, by_slope[1:])), (slopes, layer)


def test_a_length_whose_weights_do_not_fit_in_memory_is_skipped_with_its_reason(tmp_path, monkeypatch):
    """inspect.length_multipliers=[600] at the default model captured 2 x 4 x 38,400^2 weights: killed by the system."""
    model = tiny("rope")
    monkeypatch.setattr(attention_stats, "available_bytes", lambda: 1000)
    stats = attention_statistics(model, token_array(tmp_path, 4 * SEQ_LEN), SEQ_LEN, 1, CPU, torch.float32)
    assert stats["windows"] == 0 and stats["reason"].startswith("its attention weights need about")
    monkeypatch.setattr(attention_stats, "available_bytes", lambda: None)
    assert attention_statistics(model, token_array(tmp_path, 4 * SEQ_LEN), SEQ_LEN, 1, CPU, torch.float32)["windows"]


# --- the command line and compare.py ---


@pytest.fixture(scope="module")
def inspected(tmp_path_factory):
    """scripts/inspect_attention.py (in-process) on an alibi and a learned run of 2 heads, 1 layer."""
    inspect_attention = load_script("inspect_attention")
    runner = Runner(tmp_path_factory.getbasetemp())
    base = tmp_path_factory.mktemp("inspect")
    run_dirs = {pe: make_run(base / pe, runner.corpus, f"pe={pe}") for pe in ("alibi", "learned")}
    for run_dir in run_dirs.values():
        inspect_attention.main([f"run_dir={run_dir}", "inspect.windows=2"])
    return run_dirs


@pytest.mark.slow  # runs a command on a trained run
def test_outputs_exist_with_the_documented_shapes(inspected):
    document = json.loads((inspected["alibi"] / "eval" / "attention.json").read_text())
    assert document["pe"] == "alibi" and document["train_seq_len"] == SEQ_LEN and document["variation"] is None
    assert [entry["length"] for entry in document["lengths"]] == [SEQ_LEN, 8 * SEQ_LEN]
    n_layer, n_head = document["n_layer"], document["n_head"]
    for entry in document["lengths"]:
        assert entry["reason"] is None and entry["windows"] == 2
        n_distance, n_position = len(entry["distance_bins"]), len(entry["position_bins"])
        assert np.shape(entry["mean_weight"]) == (n_layer, n_head, n_distance)
        assert np.shape(entry["mean_distance"]) == (n_layer, n_head)
        assert np.shape(entry["entropy"]) == (n_layer, n_head, n_position)
        assert np.shape(entry["uniform_entropy"]) == (n_position,)
        assert entry["distance_bins"][-1][1] == entry["length"] and entry["position_bins"][-1][1] == entry["length"] + 1
        assert (np.array(entry["entropy"]) <= np.array(entry["uniform_entropy"]) + 1e-6).all()
        assert math.isclose(entry["uniform_entropy"][0], 0.0, abs_tol=1e-12)
    for name in ("attention_distance.png", "attention_entropy.png"):
        assert (inspected["alibi"] / "eval" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # runs a command on a trained run
def test_learned_past_its_table_is_recorded_with_a_reason(inspected):
    document = json.loads((inspected["learned"] / "eval" / "attention.json").read_text())
    long = document["lengths"][1]
    assert long == {"length": 8 * SEQ_LEN, "windows": 0, "reason": "pe=learned encodes at most 16 positions"}
    assert document["lengths"][0]["reason"] is None


@pytest.mark.slow  # runs a command on a trained run
def test_compare_overlays_the_entropy_of_several_runs(inspected, tmp_path):
    import eval

    runs = [inspected["alibi"], inspected["learned"]]
    documents = read_attention(runs)
    assert [label.split()[0] for label, _ in documents] == ["alibi", "learned"]
    for run_dir in runs:  # compare.py reads the perplexity results too
        eval.main([f"run_dir={run_dir}", "eval.lengths=[16]", "eval.protocols=[nonoverlapping]", "eval.max_tokens=64"])
    compare = load_script("compare")
    path = tmp_path / "entropy.png"
    compare.main(
        [
            *map(str, runs),
            "--markdown",
            str(tmp_path / "c.md"),
            "--plot",
            str(tmp_path / "c.png"),
            "--entropy",
            str(path),
        ]
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # runs a command on a trained run
def test_compare_entropy_needs_inspected_runs(inspected, tmp_path):
    with pytest.raises(PosGPTError, match="inspect_attention.py"):
        read_attention([inspected["alibi"], tmp_path])


def test_a_scheme_that_reaches_no_length_is_refused_before_the_data_is_read(tmp_path, monkeypatch):
    """pe=learned at 2x and 4x its table: every length is past its reach, which the model alone tells, so the
    command refuses before reading the corpus (it read it first, then refused)."""
    inspect_attention = load_script("inspect_attention")
    run_dir = make_run(tmp_path / "learned", Runner(tmp_path).corpus, "pe=learned")
    read = []
    monkeypatch.setattr(inspect_attention, "eval_tokens", lambda *args: read.append(args))
    with pytest.raises(PosGPTError, match="no length could be inspected: pe=learned encodes at most 16"):
        inspect_attention.plan_inspection(run_dir, ["inspect.length_multipliers=[2,4]"])
    assert read == []
