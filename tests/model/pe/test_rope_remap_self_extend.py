"""Self-Extend (Jin et al. 2024; model/pe/rope_remap.py) and the mechanism it shares with ReRoPE: two rotations
of q and k, scores merged by distance (PositionalEncoding.score_window, model/windowed_attention.py).

Checked against a transcription of the reference code (datamllab/LongLM) and against the per-pair distance formula,
on a small case; equal to plain RoPE where the window covers the sequence; cached decoding equal to a full forward;
every backend the same; labels, refusals and train.init_from. ReRoPE and the command lines:
tests/model/pe/test_rope_remap_rerope.py.
"""

import re

import pytest
import torch
from cli_runs import TINY
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
from evaluation.context import as_plain
from experiment.build import build_model
from experiment.compose import compose_config
from experiment.config import validate
from experiment.plan import load_parent
from model.kernels import resolve_backend
from model.pe.rope import RotaryPositionalEncoding
from model.pe.rope_remap import RoPERemapConfig
from model.pe.rope_scaling import RoPEScalingConfig


def self_extend_reference(q, k, v, G: int, W: int):
    """datamllab/LongLM, legacy_patch_before_4_38/llama_self_extend_patch.py, ``self_extend_forward`` with
    group_size_1 = G and group_size_2 = W, no cache (q_len == kv_seq_len), one sequence; RoPE tables indexed by
    position (``cos[position_ids]``) are rope_at."""
    T = q.shape[-2]
    position_ids = torch.arange(T)
    # neighbor_query_states, neighbor_key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin,
    #                                                                   position_ids)  # normal attention
    neighbor_q, neighbor_k = rope_at(q, position_ids), rope_at(k, position_ids)
    # _re_group_size_2 = 0 if position_ids.max() < group_size_2 else group_size_2
    re_W = 0 if position_ids.max() < W else W
    # apply_grouped_rotary_pos_emb(..., g_size_1=group_size_1, g_size_2=_re_group_size_2):
    #     position_ids_q = position_ids//g_size_1 + g_size_2 - g_size_2//g_size_1
    #     position_ids_k = position_ids//g_size_1
    group_q = rope_at(q, position_ids // G + re_W - re_W // G)
    group_k = rope_at(k, position_ids // G)
    # neighbor_attention_mask = torch.ones((q_len, kv_seq_len)); neighbor_attention_mask = torch.tril(...)
    neighbor_mask = torch.ones(T, T).tril()
    # if q_len-group_size_2 > 0:
    #     group_attention_mask = torch.tril(torch.ones((q_len-group_size_2, kv_seq_len-group_size_2)))
    #     neighbor_attention_mask[group_size_2:, :-group_size_2] -= group_attention_mask
    if T - W > 0:
        neighbor_mask[W:, :-W] -= torch.ones(T - W, T - W).tril()
    # merged_attn_weights = torch.where(neighbor_attention_mask.bool(), neighbor_attn_weights, group_attn_weights)
    return merged_attention(scores(neighbor_q, neighbor_k), scores(group_q, group_k), neighbor_mask.bool(), v)


def self_extend_decode_reference(q, k, v, G: int, W: int):
    """The same file's cached step (q_len == 1) for the last token: the cache holds neighbour- and group-rotated
    keys (``past_key_value = (neighbor_key_states, group_key_states, value_states)``), and
    ``neighbor_attention_mask[:, -group_size_2:] = 1``: the last W keys are neighbours."""
    T = q.shape[-2]
    i = torch.tensor([T - 1])
    neighbor = scores(rope_at(q[..., -1:, :], i), rope_at(k, torch.arange(T)))
    re_W = 0 if i.max() < W else W
    group = scores(rope_at(q[..., -1:, :], i // G + re_W - re_W // G), rope_at(k, torch.arange(T) // G))
    neighbor_mask = torch.zeros(1, T)
    neighbor_mask[:, -W:] = 1
    probs = torch.softmax(torch.where(neighbor_mask.bool(), neighbor, group), dim=-1)
    return probs @ v


def self_extend_distance(G: int, W: int):
    """The distance RoPE sees between positions i and j: i - j in the window, the grouped positions' beyond."""
    return lambda i, j: i - j if i - j < W else (i // G + W - W // G) - j // G


CASES = [(2, 4, 13), (3, 8, 20), (4, 4, 16)]  # (G, W, T); G = 3 does not divide W = 8


@pytest.mark.parametrize(("G", "W", "T"), CASES)
def test_self_extend_equals_the_reference_code(G, W, T):
    q, k, v = qkv(T)
    want, want_probs = self_extend_reference(q, k, v, G, W)
    got, got_probs = posgpt_attention(scheme(RoPERemapConfig("self_extend", W, G)), q, k, v)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_probs, want_probs)


@pytest.mark.parametrize(("G", "W", "T"), CASES)
def test_self_extend_equals_its_distance_formula_pair_by_pair(G, W, T):
    q, k, v = qkv(T, seed=1)
    want, _ = pairwise_attention(q, k, v, torch.arange(T), self_extend_distance(G, W))
    torch.testing.assert_close(posgpt_attention(scheme(RoPERemapConfig("self_extend", W, G)), q, k, v)[0], want)


def test_with_explicit_positions_the_window_is_by_position_not_by_index():
    """Randomized positions (training): increasing with gaps. The near keys are those within W positions."""
    q, k, v = qkv(12, seed=2)
    positions = torch.tensor([0, 1, 3, 4, 9, 10, 11, 17, 18, 30, 31, 40])
    want, _ = pairwise_attention(q, k, v, positions, self_extend_distance(2, 6))
    pe = scheme(RoPERemapConfig("self_extend", 6, 2))
    torch.testing.assert_close(posgpt_attention(pe, q, k, v, positions=positions)[0], want)


@pytest.mark.parametrize(("G", "W", "T"), CASES)
def test_a_cached_step_equals_the_references(G, W, T):
    from model.pe import PositionState

    q, k, v = qkv(T, seed=3)
    pe = scheme(RoPERemapConfig("self_extend", W, G))
    positions = torch.arange(T)
    _, keys = pe.rotate(k, k, positions, T)  # the cache: every key, rotated both ways, as the reference keeps them
    last = positions[-1:]
    state = PositionState(last, positions, T - 1, pe.prepare(last, T, {}))
    query, _ = pe.rotate(q[..., -1:, :], q[..., -1:, :], last, T, state.prepared)
    from model.kernels import attend

    got = attend(query, keys, v, pe, "sdpa", state)
    torch.testing.assert_close(got, self_extend_decode_reference(q, k, v, G, W))


@pytest.mark.parametrize("backend", ["sdpa", "flex", "math", "auto"])
def test_every_backend_runs_the_written_out_path(backend):
    pe = scheme(RoPERemapConfig("self_extend", 4, 2))
    assert resolve_backend(backend, pe, torch.device("cpu")) == "math"
    q, k, v = qkv(10)
    torch.testing.assert_close(posgpt_attention(pe, q, k, v, backend)[0], self_extend_reference(q, k, v, 2, 4)[0])


def test_blocks_of_queries_give_the_same_output(monkeypatch):
    """Long sequences run one block of queries at a time (the near/far key ranges are cut per block)."""
    import model.windowed_attention

    q, k, v = qkv(40, seed=4)
    pe = scheme(RoPERemapConfig("self_extend", 6, 3))
    whole = posgpt_attention(pe, q, k, v)
    assert model.windowed_attention._BLOCK_SCORES >= 2 * 40 * 40  # one block
    monkeypatch.setattr(model.windowed_attention, "_BLOCK_SCORES", 2 * 40 * 3)  # 3 queries per block
    blocked = posgpt_attention(pe, q, k, v)
    torch.testing.assert_close(blocked[0], whole[0])
    torch.testing.assert_close(blocked[1], whole[1])


@torch.no_grad()
def test_a_window_covering_the_sequence_is_plain_rope():
    tokens = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    plain = tiny_model(train_len=32)(tokens)
    for window in (24, 30):
        covered = tiny_model(RoPERemapConfig("self_extend", window, 4), train_len=32)(tokens)
        torch.testing.assert_close(covered, plain, rtol=1e-5, atol=1e-5)
    beyond = tiny_model(RoPERemapConfig("self_extend", 8, 4), train_len=32)(tokens)
    assert not torch.allclose(beyond, plain, rtol=1e-5, atol=1e-5)


def test_cached_decoding_equals_a_full_forward_beyond_the_window():
    tokens = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(1))
    model = tiny_model(RoPERemapConfig("self_extend", 6, 3))
    with torch.no_grad():
        full = model(tokens)
    for prompt in (1, 5, 17):
        torch.testing.assert_close(cached_logits(model, tokens, prompt), full, rtol=1e-5, atol=1e-5)


def test_training_with_randomized_positions_has_gradients():
    model = tiny_model(RoPERemapConfig("self_extend", 6, 2)).train()
    tokens = torch.randint(0, 128, (2, 12))
    positions = torch.sort(torch.randperm(64)[:12]).values
    loss = model(tokens, targets=tokens, positions=positions)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.blocks.parameters())


# --- Labels, settings, refusals ---------------------------------------------------------------------------------


def test_label_and_parse_round_trip():
    cfg = RotaryPositionalEncoding.config_class()
    settings = RotaryPositionalEncoding.parse_variation("self_extend:4:32", cfg)
    assert settings == {"remap": RoPERemapConfig("self_extend", window=32, group=4)}
    assert RotaryPositionalEncoding.variation_label(settings) == "self_extend:4:32"
    plain = {name: as_plain(value) for name, value in settings.items()}  # as result rows hold them
    assert RotaryPositionalEncoding.variation_label(plain) == "self_extend:4:32"
    labels = [label for label, _ in scheme(RoPERemapConfig()).eval_variations(["none", "self_extend:4:32", "yarn:2"])]
    assert labels == ["", "self_extend:4:32", "yarn:2"]


def test_a_run_without_a_remap_records_only_its_scaling():
    """So that its rows keep the identity they had before remaps existed (evaluation/results.py's row_key)."""
    assert scheme(RoPERemapConfig()).settings() == {"scaling": RoPEScalingConfig()}
    pe = scheme(RoPERemapConfig("self_extend", 8, 2))
    assert pe.current_variation() == "self_extend:2:8" and set(pe.settings()) == {"scaling", "remap"}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("self_extend:1:8", "group=1 is out of its domain [2, inf)"),
        ("self_extend:4", "is not self_extend:G:W"),
        ("self_extend:4:8:2", "is not self_extend:G:W"),
        ("self_extend:four:8", "is not self_extend:G:W"),
        ("self_extend:2:0", "window=0 is out of its domain"),
    ],
)
def test_malformed_entries_are_refused(spec, message):
    with pytest.raises(PosGPTError, match=re.escape(message)):
        RotaryPositionalEncoding.check_variations(RotaryPositionalEncoding.config_class(), [spec])


def test_a_window_as_long_as_the_training_length_is_refused_before_any_evaluation():
    pe = scheme(RoPERemapConfig(), train_len=64)
    with pytest.raises(PosGPTError, match="window=64 must be shorter than the training length 64"):
        pe.eval_variations(["yarn:2", "self_extend:4:64"])
    with pytest.raises(PosGPTError, match="window=64 must be shorter"):
        scheme(RoPERemapConfig("self_extend", 64, 4), train_len=64)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["pe.remap.type=self_extend", "pe.remap.window=8"], "type self_extend needs group"),
        (["pe.remap.type=self_extend", "pe.remap.group=4"], "type self_extend needs window"),
        (
            ["pe.remap.type=none", "pe.remap.window=8"],
            "window is a setting of type self_extend, rerope and string, not none",
        ),
        (["pe.remap.type=stretch"], "pe.remap.type='stretch' is not one of its choices: none, self_extend"),
        (
            ["pe.remap.type=self_extend", "pe.remap.window=8", "pe.remap.group=2", "pe.scaling.type=yarn"],
            "both extend RoPE's context: choose one",
        ),
        (
            ["pe.remap.type=self_extend", "pe.remap.window=8", "pe.remap.group=2", "eval.variations=[yarn:2]"],
            "or eval.variations (several), not both",
        ),
        (["eval.variations=[self_extend:4:8,rerope:0]"], "window=0 is out of its domain"),
    ],
)
def test_settings_that_mean_nothing_are_refused_with_the_config(overrides, message):
    with pytest.raises(PosGPTError, match=re.escape(message)):
        validate(compose_config(["pe=rope", *overrides]))


def test_p_rope_has_the_remaps_too():
    cfg = compose_config(["pe=p_rope", "pe.remap.type=self_extend", "pe.remap.window=8", "pe.remap.group=2"])
    validate(cfg)
    assert build_model(cfg).pe.score_window() == 8


def test_a_fine_tuned_child_keeps_its_own_remap_and_takes_nothing_from_its_parent(tmp_path):
    """train.init_from: the window and group are distances in tokens; the parent's length changes neither."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("unused: no data is read")
    parent_dir = make_run(tmp_path / "parent", corpus, "pe=rope")
    overrides = [*TINY, f"data.files=[{corpus}]", "pe=rope", f"train.init_from={parent_dir}", "train.seq_len=32"]
    remap = ["pe.remap.type=self_extend", "pe.remap.window=8", "pe.remap.group=2"]
    cfg, parent = load_parent(compose_config([*overrides, *remap]))
    model = build_model(cfg)
    parent.load_into(model, cfg.train.seq_len)
    assert model.pe.cfg.remap == RoPERemapConfig("self_extend", 8, 2)
    assert cfg.pe.scaling.original_seq_len is None
    cfg, _ = load_parent(compose_config(overrides))
    assert cfg.pe.remap.type == "none"
