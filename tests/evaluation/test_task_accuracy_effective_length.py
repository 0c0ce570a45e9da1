"""The effective context length (evaluation/task_accuracy.py: effective_length, relative_effective_length) on many
generated accuracy curves, against a definition written out here; eval.py's stored effective lengths unchanged by
it; and the report's per-seed values and means (reports/task_tables.py). compare.py's section, CSV and depth heatmap
through its command line: tests/scripts/test_compare_tasks.py."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluation.stats import mean_ci
from evaluation.task_accuracy import (
    effective_length,
    effective_lengths,
    grid_cell,
    relative_effective_length,
    sort_key,
    variation,
)
from reports.task_tables import TaskEntry, Thresholds, effective_length_report, length_cells, seed_effective_lengths

# The same cases on every run: no example database, derandomized.
CASES = settings(derandomize=True, database=None, max_examples=300, deadline=None)
LENGTHS = [8, 12, 16, 24, 32, 48, 64, 128, 256, 1024]
ACCURACIES = st.one_of(
    st.floats(0, 1),
    st.sampled_from([0.0, 0.5, 0.9, 1.0]),  # on the thresholds, where >= and > part
    st.none(),  # not evaluable there (a learned table's end)
    st.just(math.nan),
)
CURVES = st.dictionaries(st.sampled_from(LENGTHS), ACCURACIES, max_size=len(LENGTHS))
THRESHOLDS = st.sampled_from([0.1, 0.5, 0.9, 1.0]) | st.floats(0.01, 1)


def passes(accuracy: float | None, threshold: float) -> bool:
    return accuracy is not None and not math.isnan(accuracy) and accuracy >= threshold


def longest_passing_prefix(curve: dict[int, float | None], threshold: float) -> int | None:
    """The definition written out: the largest evaluated L with every evaluated length <= L passing."""
    candidates = [L for L in curve if all(passes(curve[k], threshold) for k in curve if k <= L)]
    return max(candidates, default=None)


@CASES
@given(CURVES, THRESHOLDS)
def test_the_effective_length_is_the_longest_length_before_the_first_failure(curve, threshold):
    found = effective_length(curve.items(), threshold)
    assert found == longest_passing_prefix(curve, threshold)
    lengths = sorted(curve)
    if not lengths or not passes(curve[lengths[0]], threshold):  # failing at the shortest: none
        assert found is None
        return
    assert all(passes(curve[L], threshold) for L in lengths if L <= found)
    later = [L for L in lengths if L > found]
    assert not later or not passes(curve[later[0]], threshold)  # the next evaluated length fails


@CASES
@given(CURVES, THRESHOLDS, st.randoms(use_true_random=False))
def test_the_order_the_lengths_come_in_does_not_matter(curve, threshold, shuffler):
    points = list(curve.items())
    shuffler.shuffle(points)
    assert effective_length(points, threshold) == effective_length(sorted(points), threshold)


@CASES
@given(st.lists(st.floats(0, 1), min_size=1, max_size=len(LENGTHS)), THRESHOLDS)
def test_a_monotone_curve_ends_at_its_last_length_above_the_threshold(values, threshold):
    curve = dict(zip(LENGTHS, sorted(values, reverse=True)))  # accuracy falling with length
    above = [L for L, accuracy in curve.items() if accuracy >= threshold]
    assert effective_length(curve.items(), threshold) == max(above, default=None)


@CASES
@given(CURVES, st.sampled_from(LENGTHS), THRESHOLDS)
def test_a_recovery_after_a_failure_does_not_count(curve, failing, threshold):
    curve = {**{L: 1.0 for L in LENGTHS}, **curve, failing: None}  # every length evaluated; one fails
    for L in (L for L in LENGTHS if L > failing):
        curve[L] = 1.0  # and every later one passes again
    found = effective_length(curve.items(), threshold)
    assert found is None or found < failing


@pytest.mark.parametrize(
    "curve, expected",
    [
        ({16: 1.0, 32: 0.95, 64: 0.91}, 64),  # every length passes: the longest evaluated
        ({16: 0.89, 32: 1.0, 64: 1.0}, None),  # fails at the shortest, 1× here: none, whatever follows
        ({16: 1.0, 32: 0.5, 64: 1.0}, 16),  # recovers at 64: does not count
        ({16: 1.0, 32: math.nan, 64: 1.0}, 16),  # no number at 32: a failure
        ({16: 1.0, 32: None, 64: 1.0}, 16),  # not evaluable at 32: a failure
        ({16: 1.0, 64: 0.95}, 64),  # 32 not evaluated: only evaluated lengths count
        ({16: 0.9}, 16),  # at the threshold: passes
        ({}, None),
    ],
)
def test_hand_made_curves(curve, expected):
    assert effective_length(curve.items(), 0.9) == expected


@CASES
@given(CURVES, st.sampled_from(LENGTHS), st.floats(0.05, 1), THRESHOLDS)
def test_the_relative_threshold_is_a_share_of_the_accuracy_at_1x(curve, train_len, ratio, floor):
    found = relative_effective_length(curve.items(), train_len, ratio, floor)
    at_1x = curve.get(train_len)
    if not passes(at_1x, floor):  # 1× not evaluated, not evaluable, or below the absolute threshold
        assert found is None
    else:
        assert found == longest_passing_prefix(curve, ratio * at_1x)


def test_relative_hand_made_curves():
    curve = {8: 0.7, 16: 0.6, 32: 0.55, 64: 0.5, 128: 0.1}.items()
    assert relative_effective_length(curve, 16, 0.9, 0.5) == 32  # 0.9 × 0.6 = 0.54
    assert relative_effective_length(curve, 16, 0.9, 0.65) is None  # 1× below the absolute threshold
    assert relative_effective_length(curve, 24, 0.9, 0.5) is None  # 1× not evaluated
    assert relative_effective_length({16: 0.0, 32: 0.0}.items(), 16, 0.9, 0.01) is None  # nothing to keep
    assert relative_effective_length({16: 1.0, 32: 0.9}.items(), 16, 1.0, 0.5) == 16  # ratio 1: no drop allowed


def stored_effective_lengths(rows: list[dict], threshold: float) -> dict[str, int | None]:
    """eval.py's effective lengths as the loop that effective_length replaced computed them, verbatim."""
    by_label: dict[str, list[dict]] = {}
    for row in sorted((r for r in rows if grid_cell(r) is None), key=sort_key):
        by_label.setdefault(variation(row), []).append(row)
    found: dict[str, int | None] = {}
    for label, lengths in by_label.items():
        found[label] = None
        for row in lengths:
            if row["accuracy"] is None or row["accuracy"] < threshold:
                break
            found[label] = row["length"]
    return found


def test_eval_pys_stored_effective_lengths_are_unchanged():
    """The rows of many generated runs (variations, a depth grid, lengths not evaluable): effective_lengths, which
    eval.py stores in tasks.json, gives what the loop it replaced gave."""
    generator = random.Random(0)
    for _ in range(300):
        rows = [
            {
                "task": "passkey",
                "length": length,
                "depth": depth,
                "variation": variation,
                "accuracy": generator.choice([None, 0.0, 0.5, 0.89, 0.9, 1.0, generator.random()]),
            }
            for variation in ("", "yarn:8")
            for depth in (None, 0.5)
            for length in generator.sample(LENGTHS, generator.randint(1, 5))
        ]
        threshold = generator.choice([0.5, 0.9, 1.0])
        assert effective_lengths(rows, threshold) == stored_effective_lengths(rows, threshold)


def entry(accuracy_by_seed: dict[int, dict[int, float | None]], train_len: int = 16) -> TaskEntry:
    """A setting at random depth: per train.seed, {length: accuracy}."""
    per_seed = [
        {length: {"task": "passkey", "length": length, "accuracy": value, "n": 100} for length, value in seed.items()}
        for seed in accuracy_by_seed.values()
    ]
    return TaskEntry("rope", "rope", train_len, per_seed, list(accuracy_by_seed), identity="passkey (key_len=4)")


def test_a_failing_seed_counts_as_0_and_a_seed_without_1x_has_no_relative_length():
    setting = entry(
        {
            3: {16: 0.4, 32: 0.9},  # fails at its shortest length: — (0), listed last: train.seed order
            1: {16: 1.0, 32: 0.95, 64: 0.6},  # passes 0.5 everywhere (≥64); relative 0.9: to 32
            2: {8: 1.0, 32: 1.0},  # 1× (16) not evaluated: no relative length
        }
    )
    found = seed_effective_lengths(setting, Thresholds())
    assert found == {"absolute": {1: 64, 2: 32, 3: 0}, "relative": {1: 32, 3: 0}}
    absolute_mean, absolute_seeds = length_cells(setting, found["absolute"])
    assert absolute_mean == mean_ci([64, 32, 0]) and absolute_seeds == "≥64, ≥32, —"
    relative_mean, relative_seeds = length_cells(setting, found["relative"])
    assert relative_mean == mean_ci([32, 0]) and relative_seeds == "32, n/a, —"
    report = effective_length_report([setting], Thresholds())
    assert report.startswith("## Effective context length (accuracy ≥ 0.5; accuracy ≥ 0.9 × 1×)\n")
    assert "### passkey (key_len=4)" in report
    assert "| rope | 3 | **32 ± 79** | **16 ± 203 (n=2)** | ≥64, ≥32, — | 32, n/a, — |" in report


def test_every_seed_failing_is_a_dash_not_a_mean_of_0():
    setting = entry({1: {16: 0.1, 32: 0.0}, 2: {16: 0.2, 32: 0.0}})
    assert length_cells(setting, seed_effective_lengths(setting, Thresholds())["absolute"]) == ("—", "—, —")
    other = Thresholds(absolute=0.15, relative=0.5)
    assert other.titles() == {"absolute": "accuracy ≥ 0.15", "relative": "accuracy ≥ 0.5 × 1×"}
    assert seed_effective_lengths(setting, other) == {"absolute": {1: 0, 2: 16}, "relative": {1: 0, 2: 16}}


def test_no_entry_off_a_grid_is_no_section():
    setting = entry({1: {16: 1.0}})
    setting.cell = ("distance", 4.0)  # the copy probe: every row on its grid
    assert effective_length_report([setting], Thresholds()) == ""
