"""ReRoPE and leaky ReRoPE (Su 2023; model/pe/rope_remap.py): against a transcription of the reference code
(bojone/rerope), its cached step included, and the per-pair distance formula; equal to plain RoPE where the
window covers the sequence; cached decoding equal to a full forward; labels and refusals; and, through the command
lines, eval.py's eval.variations with Self-Extend and ReRoPE on a tiny run, sample.py with a remap, and a refusal.

The mechanism both remaps share (blocks, backends, explicit positions, init_from):
tests/model/pe/test_rope_remap_self_extend.py.
"""

import json
import re

import pytest
import torch
from cli_runs import assert_one_line_error
from rope_remap_cases import (
    cached_logits,
    merged_attention,
    pairwise_attention,
    posgpt_attention,
    qkv,
    rope_at,
    scheme,
    scores,
    tiny_model,
)
from tiny_checkpoint import make_run

from core.errors import PosGPTError
from experiment.compose import compose_config
from experiment.config import validate
from model.kernels import attend
from model.pe import PositionState
from model.pe.rope import RotaryPositionalEncoding
from model.pe.rope_remap import RoPERemapConfig


def rerope_reference(q, k, v, window: int, leaky_factor: float | None = None):
    """bojone/rerope, rerope_patch.py (leaky_factor None) and leaky_rerope_patch.py (``scaling_factor`` k),
    ``forward_with_[leaky_]rerope`` for q_len > 1, one sequence, without the log-n factor both patches also apply
    to queries (``query_states *= ((position_ids + 1)...log() / np.log(training_length)).clip(1)``), which is not
    ReRoPE's position mapping. RoPE tables indexed by position are rope_at; ``rotary_emb2``, a
    LlamaLinearScalingRotaryEmbedding, is rope_at at position / k."""
    position_ids = torch.arange(q.shape[-2])
    # query_states1, key_states1 = apply_rotary_pos_emb(query_states, key_states, cos, sin, position_ids)
    q1, k1 = rope_at(q, position_ids), rope_at(k, position_ids)
    if leaky_factor is None:
        # query_states2, _ = apply_rotary_pos_emb(query_states, None, cos, sin, position_ids * 0 + window)
        # key_states2 = repeat_kv(key_states, self.num_key_value_groups)   (unrotated)
        q2, k2 = rope_at(q, position_ids * 0 + window), k
    else:
        # offset = window * (scaling_factor - 1)
        # query_states2, _ = apply_rotary_pos_emb(query_states, None, cos2, sin2, position_ids + offset)
        # _, key_states2 = apply_rotary_pos_emb(None, key_states, cos2, sin2, position_ids)
        offset = window * (leaky_factor - 1)
        q2, k2 = rope_at(q, (position_ids + offset) / leaky_factor), rope_at(k, position_ids / leaky_factor)
    # rectified_mask = (position_ids[:, -q_len:, None] - position_ids[:, None]).abs() < window
    rectified_mask = (position_ids[:, None] - position_ids[None]).abs() < window
    # attn_weights = torch.where(rectified_mask, attn_weights1, attn_weights2)
    return merged_attention(scores(q1, k1), scores(q2, k2), rectified_mask, v)


def rerope_decode_reference(q, k, v, window: int, leaky_factor: float | None = None):
    """The same files' cached step (q_len == 1) for the last token: the cache holds unrotated keys and their
    positions; the query stays unrotated and every key is rotated back by the distance the pair should see:
    rerope_patch.py ``position_ids = (position_ids[:, -1] - position_ids).clip(max=window)``, leaky_rerope_patch.py
    ``position_ids[:, -1:] - position_ids`` looked up in ``cat([cos[:, :, :window], cos2[:, :, window + offset:]])``
    (below the window RoPE's table, from it on the scaled one, shifted by offset); then
    ``apply_rotary_pos_emb(None, key_states, cos, -sin, position_ids)``."""
    T = q.shape[-2]
    distance = (T - 1 - torch.arange(T)).to(torch.float64)
    if leaky_factor is None:
        distance = distance.clip(max=window)
    else:
        offset = window * (leaky_factor - 1)
        distance = torch.where(distance < window, distance, (distance + offset) / leaky_factor)
    keys = rope_at(k, -distance)  # -sin: the rotation by minus the distance
    probs = torch.softmax(scores(q[..., -1:, :], keys), dim=-1, dtype=torch.float32)
    return probs @ v


def rerope_distance(window: int, leaky_factor: float | None = None):
    """min(i - j, W); leaky: W + (i - j - W) / k beyond W."""
    if leaky_factor is None:
        return lambda i, j: min(i - j, window)
    return lambda i, j: i - j if i - j < window else window + (i - j - window) / leaky_factor


CASES = [(4, None, 13), (6, None, 20), (4, 4.0, 13), (6, 16.0, 20), (5, 2.5, 17)]  # (W, k, T)


@pytest.mark.parametrize(("window", "leaky", "T"), CASES)
def test_rerope_equals_the_reference_code(window, leaky, T):
    q, k, v = qkv(T)
    want, want_probs = rerope_reference(q, k, v, window, leaky)
    got, got_probs = posgpt_attention(scheme(RoPERemapConfig("rerope", window, leaky_factor=leaky)), q, k, v)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_probs, want_probs)


@pytest.mark.parametrize(("window", "leaky", "T"), CASES)
def test_rerope_equals_its_distance_formula_pair_by_pair(window, leaky, T):
    q, k, v = qkv(T, seed=1)
    want, _ = pairwise_attention(q, k, v, torch.arange(T), rerope_distance(window, leaky))
    got = posgpt_attention(scheme(RoPERemapConfig("rerope", window, leaky_factor=leaky)), q, k, v)[0]
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize(("window", "leaky", "T"), CASES)
def test_a_cached_step_equals_the_references(window, leaky, T):
    """posgpt caches both rotations of every key; the reference caches unrotated keys and rotates them back at every
    step. Same attention."""
    q, k, v = qkv(T, seed=2)
    pe = scheme(RoPERemapConfig("rerope", window, leaky_factor=leaky))
    positions = torch.arange(T)
    _, keys = pe.rotate(k, k, positions, T)
    last = positions[-1:]
    state = PositionState(last, positions, T - 1, pe.prepare(last, T, {}))
    query, _ = pe.rotate(q[..., -1:, :], q[..., -1:, :], last, T, state.prepared)
    got = attend(query, keys, v, pe, "sdpa", state)
    torch.testing.assert_close(got, rerope_decode_reference(q, k, v, window, leaky))


@torch.no_grad()
@pytest.mark.parametrize("leaky", [None, 8.0])
def test_a_window_covering_the_sequence_is_plain_rope(leaky):
    tokens = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    plain = tiny_model(train_len=32)(tokens)
    covered = tiny_model(RoPERemapConfig("rerope", 24, leaky_factor=leaky), train_len=32)(tokens)
    torch.testing.assert_close(covered, plain, rtol=1e-5, atol=1e-5)
    beyond = tiny_model(RoPERemapConfig("rerope", 8, leaky_factor=leaky), train_len=32)(tokens)
    assert not torch.allclose(beyond, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("leaky", [None, 4.0])
def test_cached_decoding_equals_a_full_forward_beyond_the_window(leaky):
    tokens = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(1))
    model = tiny_model(RoPERemapConfig("rerope", 6, leaky_factor=leaky))
    with torch.no_grad():
        full = model(tokens)
    for prompt in (1, 9):
        torch.testing.assert_close(cached_logits(model, tokens, prompt), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("spec", "settings"),
    [("rerope:8", RoPERemapConfig("rerope", 8)), ("rerope:8:16", RoPERemapConfig("rerope", 8, leaky_factor=16.0))],
)
def test_label_and_parse_round_trip(spec, settings):
    cfg = RotaryPositionalEncoding.config_class()
    assert RotaryPositionalEncoding.parse_variation(spec, cfg) == {"remap": settings}
    assert RotaryPositionalEncoding.variation_label({"remap": settings}) == spec
    assert RotaryPositionalEncoding.parse_variation(f" {spec.replace(':', ' : ')} ", cfg) == {"remap": settings}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("rerope", "is not rerope:W or rerope:W:K"),
        ("rerope:8.5", "is not rerope:W or rerope:W:K"),
        ("rerope:8:4:2", "is not rerope:W or rerope:W:K"),
        ("rerope:8:1", "leaky_factor=1.0 is out of its domain (1, inf)"),
    ],
)
def test_malformed_entries_are_refused(spec, message):
    with pytest.raises(PosGPTError, match=re.escape(message)):
        RotaryPositionalEncoding.check_variations(RotaryPositionalEncoding.config_class(), [spec])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["pe.remap.type=rerope"], "type rerope needs window"),
        (["pe.remap.type=rerope", "pe.remap.window=8", "pe.remap.group=2"], "group is a setting of type self_extend"),
        (["pe.remap.type=self_extend", "pe.remap.window=8", "pe.remap.group=2", "pe.remap.leaky_factor=4"], "not self"),
        (["pe.remap.type=rerope", "pe.remap.window=8", "pe.scaling.type=ntk", "pe.scaling.factor=2"], "choose one"),
    ],
)
def test_settings_that_mean_nothing_are_refused_with_the_config(overrides, message):
    with pytest.raises(PosGPTError, match=re.escape(message)):
        validate(compose_config(["pe=rope", *overrides]))


# --- Through the command lines, in-process, on an untrained tiny RoPE run (what is checked is the plumbing) -------


@pytest.fixture(scope="module")
def rope_run(cli):
    return make_run(cli.base / "remap-rope-run", cli.corpus, "pe=rope")


@pytest.mark.slow
def test_eval_scores_self_extend_and_rerope_as_variations(cli, rope_run):
    variations = ["self_extend:2:8", "rerope:8", "rerope:8:4"]
    done = cli.eval_here(
        rope_run,
        f"eval.variations=[none,{','.join(variations)}]",
        "eval.lengths=[16,64]",
        "eval.max_tokens=256",
        "eval.protocols=[nonoverlapping]",
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads((rope_run / "eval" / "extrapolation.json").read_text())["results"]
    assert sorted({row["variation"] for row in rows}) == sorted(["", *variations])
    assert all(row["ppl"] is not None and row["attn_backend"] == "math" for row in rows if row["variation"])
    by_label = {(row["variation"], row["length"]): row for row in rows}
    assert by_label[("rerope:8:4", 64)]["variation_settings"] == {
        "remap": {
            "type": "rerope",
            "window": 8,
            "group": None,
            "leaky_factor": 4.0,
            "local_window": None,
            "attention_factor": None,
        }
    }
    assert "scaling" in by_label[("", 16)]["variation_settings"]  # the run as trained: its scaling alone
    # Each variation was applied: an untrained model's perplexities differ only slightly, but they differ.
    assert len({by_label[(label, 64)]["ppl"] for label in ["", *variations]}) == 4
    assert "rerope:8:4" in (rope_run / "eval" / "extrapolation.csv").read_text()


@pytest.mark.slow
def test_sample_generates_with_a_remap(cli, rope_run):
    done = cli.here(
        "sample.py",
        f"run_dir={rope_run}",
        "pe.remap.type=self_extend",
        "pe.remap.window=8",
        "pe.remap.group=2",
        "sample.max_new_tokens=24",
        "sample.prompt=def main",
    )
    assert done.returncode == 0, done.stderr
    assert "pe=rope self_extend:2:8" in done.stderr


@pytest.mark.slow
def test_a_window_as_long_as_the_training_length_is_refused_in_one_line(cli, rope_run):
    done = cli.eval_here(rope_run, "eval.variations=[rerope:16]", "eval.lengths=[32]", "eval.max_tokens=64")
    assert_one_line_error(done, "window=16 must be shorter than the training length 16")
    done = cli.here("sample.py", f"run_dir={rope_run}", "pe.remap.type=rerope", "pe.remap.window=16")
    assert_one_line_error(done, "window=16 must be shorter than the training length 16")
