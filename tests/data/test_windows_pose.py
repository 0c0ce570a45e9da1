"""PoSE (train.pose; data/windows.py, pose_positions): its positions against independent re-implementations of the
reference's sampling (dwzhu-pku/PoSE, src/train_pose.py, and the paper's appendix code for three chunks), a
property test over the window, the target length and the chunks, the batch stream's resume, the refusals, and tiny
trainings through train.py, alone and with YaRN."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
import torch
from cli_runs import assert_one_line_error, train_losses
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import PosGPTError
from data import TokenArray
from data.tasks import build_task
from data.tasks.passkey import PasskeyConfig
from data.windows import PoSEConfig, pose_positions
from experiment.compose import compose_config
from experiment.plan import check_training_config
from training.batch_stream import BatchStream
from training.distributed import DistInfo

CASES = settings(derandomize=True, database=None, max_examples=200, deadline=None)


# --- the reference, re-implemented from reading it -----------------------------------------------------------------


def reference_two_chunks(window: int, target: int, rng: random.Random) -> tuple[int, ...]:
    """src/train_pose.py, train_preprocess_function_pose, for a document of at least ``window`` tokens: the first
    chunk is ids[0:rt1], rt1 = randint(1, (len_chunk + 1) // 2), at positions 0..; the second chunk's positions
    are shifted by rt = randint(lt, scaled_max_position_embeddings - len(chunked_ids)) with lt = 0."""
    first = rng.randint(1, (window + 1) // 2)
    skip = rng.randint(0, target - window)
    return tuple(range(first)) + tuple(p + skip for p in range(first, window))


def reference_three_chunks(window: int, target: int, rng: random.Random) -> tuple[int, ...]:
    """The paper's appendix B (Figure 6) for three chunks: l0 = randint(1, Lc - 2), l1 = randint(1, Lc - l0 - 1),
    l2 the rest; u1 = randint(0, Lt - Lc), u2 = randint(u1, Lt - Lc); chunk i at positions st_i + u_i .. (eq. 4)."""
    l0 = rng.randint(1, window - 2)
    l1 = rng.randint(1, window - l0 - 1)
    u1 = rng.randint(0, target - window)
    u2 = rng.randint(u1, target - window)
    return tuple(range(l0)) + tuple(p + u1 for p in range(l0, l0 + l1)) + tuple(p + u2 for p in range(l0 + l1, window))


def exact_two_chunks(window: int, target: int) -> dict[tuple[int, ...], Fraction]:
    """The probability of each position row the reference's two-chunk draw gives: every (rt1, rt) equally likely."""
    firsts, skips = range(1, (window + 1) // 2 + 1), range(target - window + 1)
    weight = Fraction(1, len(firsts) * len(skips))
    rows: Counter = Counter()
    for first, skip in itertools.product(firsts, skips):
        rows[tuple(range(first)) + tuple(p + skip for p in range(first, window))] += weight
    return dict(rows)


def exact_three_chunks(window: int, target: int) -> dict[tuple[int, ...], Fraction]:
    """The same for the appendix's three-chunk draw: each randint uniform given the ones before it."""
    rows: Counter = Counter()
    top = target - window
    for l0 in range(1, window - 1):
        for l1 in range(1, window - l0):
            for u1 in range(top + 1):
                for u2 in range(u1, top + 1):
                    weight = Fraction(1, (window - 2) * (window - l0 - 1) * (top + 1) * (top - u1 + 1))
                    row = (*range(l0), *(p + u1 for p in range(l0, l0 + l1)), *(p + u2 for p in range(l0 + l1, window)))
                    rows[row] += weight
    return dict(rows)


def assert_matches(drawn: Counter, exact: dict[tuple[int, ...], Fraction], draws: int) -> None:
    """Every drawn row is in the exact distribution's support, every row of the support is drawn, and each row's
    frequency is within 5 standard errors of its probability."""
    assert set(drawn) == set(exact)
    for row, probability in exact.items():
        p = float(probability)
        assert abs(drawn[row] / draws - p) <= 5 * (p * (1 - p) / draws) ** 0.5, (row, drawn[row] / draws, p)


def ours(draws: int, window: int, target: int, chunks: int, seed: int) -> Counter:
    positions = pose_positions(draws, window, PoSEConfig(target, chunks), torch.Generator().manual_seed(seed))
    return Counter(tuple(row) for row in positions.tolist())


def test_two_chunks_draw_the_reference_scripts_distribution():
    window, target, draws = 6, 12, 40_000  # first chunk 1..3 tokens, skip 0..6: 21 outcomes, 15 distinct rows
    exact = exact_two_chunks(window, target)
    assert sum(exact.values()) == 1 and exact[tuple(range(window))] == Fraction(1, 7)  # skip 0: the plain window
    assert_matches(ours(draws, window, target, 2, seed=0), exact, draws)
    rng = random.Random(0)  # the re-implementation draws the same distribution (it is the one enumerated)
    assert_matches(Counter(reference_two_chunks(window, target, rng) for _ in range(draws)), exact, draws)


def test_three_chunks_draw_the_papers_appendix_distribution():
    window, target, draws = 5, 8, 60_000
    exact = exact_three_chunks(window, target)
    assert sum(exact.values()) == 1
    assert_matches(ours(draws, window, target, 3, seed=1), exact, draws)
    rng = random.Random(1)
    assert_matches(Counter(reference_three_chunks(window, target, rng) for _ in range(draws)), exact, draws)


def test_a_window_of_a_long_extension_covers_far_relative_distances():
    """2k -> 16k as the paper's Figure 5, scaled down: L = 64, L_t = 512. The largest distance a row spans is
    L_t - 1 at most and reaches past L in most rows (the skip is uniform over 0..L_t - L)."""
    positions = pose_positions(4000, 64, PoSEConfig(512, 2), torch.Generator().manual_seed(2))
    span = positions[:, -1] - positions[:, 0]
    assert span.max() == 511 and span.min() == 63 and (span >= 64).float().mean() > 0.99
    assert (positions[:, 0] == 0).all()
    skip = span - 63  # u_1
    assert abs(skip.float().mean().item() - 224) < 5  # uniform over 0..448


# --- properties -----------------------------------------------------------------------------------------------------


@st.composite
def draws(draw):
    window = draw(st.integers(2, 48))
    target = window + draw(st.integers(1, 200))
    chunks = draw(st.integers(2, min(6, window)))
    return window, target, chunks, draw(st.integers(1, 4)), draw(st.integers(0, 2**16))


@CASES
@given(draws())
def test_every_row_is_n_chunks_of_consecutive_positions_from_0_below_the_target(case):
    window, target, chunks, batch, seed = case
    pose = PoSEConfig(target, chunks)
    positions = pose_positions(batch, window, pose, torch.Generator().manual_seed(seed))
    assert positions.shape == (batch, window) and positions.dtype == torch.long
    assert torch.equal(positions, pose_positions(batch, window, pose, torch.Generator().manual_seed(seed)))
    assert (positions[:, 0] == 0).all() and (positions.max(dim=1).values < target).all()
    steps = positions.diff(dim=1)
    assert (steps >= 1).all()  # increasing: the skips never go back (u_i >= u_{i-1})
    jumps = (steps > 1).sum(dim=1)
    assert (jumps <= chunks - 1).all()  # within a chunk the positions are consecutive
    if chunks == 2:  # the script's first chunk: at most (L + 1) // 2 tokens
        for row in positions.tolist():
            first = next((j + 1 for j in range(window - 1) if row[j + 1] - row[j] > 1), None)
            assert first is None or first <= (window + 1) // 2


@CASES
@given(draws())
def test_a_task_instance_is_chunked_over_its_own_tokens_and_its_pads_repeat_its_last(case):
    window, target, chunks, batch, seed = case
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, window + 1, (batch,), generator=generator)
    positions = pose_positions(batch, window, PoSEConfig(target, chunks), generator, lengths)
    for row, n in zip(positions.tolist(), lengths.tolist()):
        assert row[0] == 0 and all(b > a for a, b in zip(row[: n - 1], row[1:n]))
        assert row[n - 1] <= target - 1 and set(row[n:]) <= {row[n - 1]}
        assert sum(b - a > 1 for a, b in zip(row[: n - 1], row[1:n])) <= chunks - 1


# --- the batch stream -------------------------------------------------------------------------------------------------


def test_the_batch_stream_draws_pose_positions_after_the_tokens_and_resumes_them(tmp_path):
    shard = tmp_path / "shard.bin"
    (np.arange(1000) % 50).astype(np.uint16).tofile(shard)
    tokens = TokenArray([shard], name="train")
    pose = PoSEConfig(64, 2)
    stream = BatchStream(tokens, 4, 12, 0, DistInfo(), torch.device("cpu"), pose=pose)
    _, _, first = stream.next()
    generator = torch.Generator().manual_seed(0)
    torch.randint(0, 1000 - 12 - 1, (4,), generator=generator)  # the windows' starts (data/windows.py, sample_batch)
    assert torch.equal(first, pose_positions(4, 12, pose, generator))
    state = stream.sampler_state
    expected = stream.next()
    resumed = BatchStream(tokens, 4, 12, 0, DistInfo(), torch.device("cpu"), state=state, pose=pose)
    for got, want in zip(resumed.next(), expected):
        assert torch.equal(got, want)
    assert BatchStream(tokens, 4, 12, 0, DistInfo(), torch.device("cpu"), pose=PoSEConfig()).next()[2] is None


def test_a_task_stream_chunks_each_instance_over_its_length():
    task = build_task(PasskeyConfig())
    pose = PoSEConfig(256, 2)
    _, _, positions = BatchStream(task, 16, 64, 0, DistInfo(), torch.device("cpu"), pose=pose).next()
    generator = torch.Generator().manual_seed(0)
    _, _, lengths = task.training_instances(16, 64, generator)
    assert torch.equal(positions, pose_positions(16, 64, pose, generator, lengths))


# --- refusals -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.pose.target_len=64"], "must exceed train.seq_len=64"),
        (["train.seq_len=4", "train.pose.target_len=64", "train.pose.chunks=5"], "more chunks than it has tokens"),
        (["train.pose.chunks=3"], "read only with train.pose.target_len"),
        (["train.pose.target_len=256", "train.random_positions=256"], "use one of them"),
        (["train.pose.target_len=256", "data.document_aware=true"], "train.pose.target_len draws one set per window"),
        (["train.pose.target_len=1"], "out of its domain"),
        (["train.pose.target_len=256", "train.pose.chunks=1"], "out of its domain"),
    ],
)
def test_settings_that_cannot_train_are_refused(overrides, message):
    with pytest.raises(PosGPTError, match=message):
        check_training_config(compose_config(["pe=rope", *overrides]))


def test_defaults_are_off():
    assert PoSEConfig() == PoSEConfig(None, 2)
    check_training_config(compose_config(["pe=rope"]))
    check_training_config(compose_config(["pe=rope", "train.pose.target_len=256", "train.pose.chunks=3"]))


# --- through train.py ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("scaling", [[], ["pe.scaling.type=yarn", "pe.scaling.factor=4"]], ids=["alone", "yarn"])
def test_train_py_fine_tunes_at_l_with_positions_covering_4l(cli, tmp_path, scaling):
    run = tmp_path / "pose"
    done = cli.train_here(run, "pe=rope", "train.max_steps=10", "train.pose.target_len=64", *scaling)
    assert done.returncode == 0, done.stderr
    assert sorted(train_losses(run)) == list(range(1, 11))
    config = (run / ".hydra" / "config.yaml").read_text()
    assert "pose:\n    target_len: 64\n    chunks: 2" in config


def test_train_py_refuses_pose_where_the_scheme_cannot_take_it(cli, tmp_path):
    # pe=learned (the test model's): a table of 16 positions
    refused = cli.train_here(tmp_path / "table", "train.max_steps=1", "train.pose.target_len=64")
    assert_one_line_error(refused, "train.pose.target_len=64: pe=learned encodes at most 16 positions")
    refused = cli.train_here(tmp_path / "none", "pe=none", "train.max_steps=1", "train.pose.target_len=64")
    assert_one_line_error(refused, "train.pose.target_len: pe=none does not use token positions")
    assert not (tmp_path / "table").exists() and not (tmp_path / "none").exists()
