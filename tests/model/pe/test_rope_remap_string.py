"""STRING (An et al. 2025; model/pe/rope_remap.py, ``string:W:w``): posgpt's relative positions and attention
against a transcription of the reference code, HKUNLP/STRING string_for_llama.py (it needs flash-attn and CUDA, so
it cannot be installed here: its index mapping and its attention are transcribed below, flash attention replaced
by the softmax its docstring defines). Also the per-pair distance formula, randomized positions, cached decoding,
a window covering the sequence, labels and refusals.

The reference multiplies cos and sin by its attention factor 0.1 ln 2 + 1 (``attention_factor`` in
string_for_llama.py's ``replace_with_string``); the transcription applies it where the reference does, to every
rotated query and key. Inputs are float64 and the references run in float64; posgpt stores cos and sin and computes
the windowed scores in float32, hence tolerances of 1e-5 (about 100x that rounding).
"""

import json
import math
import re

import pytest
import torch
from rope_remap_cases import TRAIN_LEN, cached_logits, pairwise_attention, posgpt_attention, rope_at, scheme, tiny_model
from tiny_checkpoint import make_run

from core.errors import PosGPTError
from experiment.build import build_model
from experiment.compose import compose_config
from experiment.config import validate
from model.pe import ModelDims
from model.pe.rope import RoPEConfig, RotaryPositionalEncoding
from model.pe.rope_remap import STRING_ATTENTION_FACTOR, RoPERemapConfig

LOOSE = {"rtol": 1e-5, "atol": 1e-5}
CASES = [(6, 2, 15), (8, 0, 20), (5, 4, 13)]  # (W = diag_size, w = local_window, T), T > W


# replace_with_string: attention_factor = 0.1*math.log(2) + 1, written out here as the reference writes it
REFERENCE_FACTOR = 0.1 * math.log(2) + 1


def string(window: int, local_window: int, factor: float | None = None) -> RoPERemapConfig:
    return RoPERemapConfig("string", window=window, local_window=local_window, attention_factor=factor)


def resolved_string(window: int, local_window: int) -> RoPERemapConfig:
    return string(window, local_window, REFERENCE_FACTOR)


def rope_scaled(x: torch.Tensor, positions: torch.Tensor, factor: float) -> torch.Tensor:
    """apply_rotary_pos_emb with the reference's cos_cached and sin_cached, both multiplied by ``factor``."""
    return rope_at(x, positions) * factor


def qkv(T: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, T, 8, generator=generator, dtype=torch.float64) for _ in range(3))


# --- The reference, transcribed (q, k, v as (B, H, T, d) throughout: its transposes to flash's (B, T, H, d) and
# back are left out) -------------------------------------------------------------------------------------------


def flash_attention(q, k, v, causal=True, window_left=-1):
    """flash_attn_func / flash_attn_with_kvcache with return of softmax_lse, as their docstring defines them: query i
    of Tq over Tk keys sees key j when j <= i + Tk - Tq (causal, the mask aligned bottom-right) and
    j >= i + Tk - Tq - window_left (window_size=[window_left, 0], inclusive; -1: no window); softmax scale
    1 / sqrt(d). Returns (out, lse), lse (B, H, Tq)."""
    Tq, Tk = q.shape[-2], k.shape[-2]
    i = torch.arange(Tq)[:, None] + Tk - Tq
    j = torch.arange(Tk)[None, :]
    allowed = (j <= i) if causal else torch.ones(Tq, Tk, dtype=torch.bool)
    if window_left >= 0:
        allowed &= j >= i - window_left
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~allowed, -math.inf)
    return scores.softmax(-1) @ v, scores.logsumexp(-1)


def string_prefill_reference(
    q, k, v, diag_size: int, local_window: int, window_left: int | None = None, factor: float = REFERENCE_FACTOR
):
    """string_for_llama.py, ``forward`` without a KV cache, then ``string_flash_forward``; one sequence,
    position_ids = arange(T). ``window_left``: the diagonal part's window, ``diag_size`` as written; ``factor``: the
    attention factor in cos and sin."""
    T = q.shape[-2]
    position_ids = torch.arange(T)
    # key_states = apply_rotary_pos_emb(key_states, cos, sin, position_ids)
    key_states = rope_scaled(k, position_ids, factor)
    query_states_1 = rope_scaled(q, position_ids, factor)
    position_ids = position_ids - diag_size + local_window
    query_states_2 = rope_scaled(q, position_ids, factor)
    # diag_out, diag_lse, _ = flash_attn_func(neighbor_query_states, key_states, value_states, causal=True,
    #                                         window_size=[diag_size, 0], return_attn_probs=True)
    left = diag_size if window_left is None else window_left
    diag_out, diag_lse = flash_attention(query_states_1, key_states, v, window_left=left)
    triangle_len = T - diag_size
    if triangle_len < 0:
        return diag_out
    # shifted_out, shifted_lse, _ = flash_attn_func(shifted_query_states[:, -triangle_len:, :, :],
    #     key_states[:, :triangle_len, :, :], value_states[:, :triangle_len, :, :], causal=True, window_size=[-1, -1])
    shifted_out, shifted_lse = flash_attention(
        query_states_2[..., -triangle_len:, :], key_states[..., :triangle_len, :], v[..., :triangle_len, :]
    )
    S = T - shifted_out.shape[-2]  # L = diag_out.size(1); N = shifted_out.size(1); S = L - N
    diag_out_head, diag_lse_tail, diag_out_tail = diag_out[..., :S, :], diag_lse[..., S:], diag_out[..., S:, :]
    lse_gap = 1 / (1 + torch.exp(diag_lse_tail - shifted_lse))
    lse_gap_re = 1 / (1 + torch.exp(shifted_lse - diag_lse_tail))
    merge_out_tail = diag_out_tail * lse_gap_re[..., None] + shifted_out * lse_gap[..., None]
    return torch.cat([diag_out_head, merge_out_tail], dim=-2)


def string_decode_reference(q, k, v, diag_size: int, local_window: int, factor: float = REFERENCE_FACTOR):
    """The same ``forward`` with a KV cache (has_kv_cache), for the last token over every key before it: the cache
    holds keys rotated at their positions; flash decoding of query_states_1 over the last diag_size keys and of
    query_states_2 (shifted) over the others, merged by their lse."""
    kv_seq_len = k.shape[-2]
    position_ids = torch.tensor([kv_seq_len - 1])
    key_cache = rope_scaled(k, torch.arange(kv_seq_len), factor)
    query_states_1 = rope_scaled(q[..., -1:, :], position_ids, factor)
    position_ids = position_ids - diag_size + local_window
    query_states_2 = rope_scaled(q[..., -1:, :], position_ids, factor)
    shifted_size = kv_seq_len - diag_size
    out1, lse1 = flash_attention(query_states_1, key_cache[..., shifted_size:, :], v[..., shifted_size:, :], False)
    out2, lse2 = flash_attention(query_states_2, key_cache[..., :shifted_size, :], v[..., :shifted_size, :], False)
    gap21 = 1 / (1 + torch.exp(lse2 - lse1))
    gap12 = 1 / (1 + torch.exp(lse1 - lse2))
    return out1 * gap21[..., None] + out2 * gap12[..., None]


def reference_distances(T: int, diag_size: int, local_window: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference's index mapping: (the distance a pair's rotations encode, (T, T), by the decoding step's split
    of the cache at kv_seq_len - diag_size; the prefill's diagonal part, pairs with 0 <= i - j <= diag_size, a
    mask; its shifted part, pairs with j <= i - diag_size, a mask). Rows with no key before the split (i <
    diag_size) are all in the diagonal part, as in the prefill, which is what runs there."""
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    shifted_query = i - diag_size + local_window  # position_ids - diag_size + local_window; keys at position_ids
    near = (j > i - diag_size) & (j <= i)  # key_cache[:, shifted_size:kv_seq_len], shifted_size = i + 1 - diag_size
    distance = torch.where(near, i - j, shifted_query - j).masked_fill(j > i, -1)
    return distance, (j >= i - diag_size) & (j <= i), j <= i - diag_size


# --- posgpt --------------------------------------------------------------------------------------------------------


def posgpt_distances(remap: RoPERemapConfig, T: int) -> torch.Tensor:
    """The distance posgpt's rotations encode for each pair (i, j), read from q . k: a head of 4 coordinates whose
    second pair turns base^(-2/4) = 1e-4 rad per position, q = e_1 against k = e_1 and k = e_3 (that pair's two
    coordinates) give cos and sin of 1e-4 (angle of q - angle of k). The near rotations' where i - j < W and the
    far ones' beyond (model/windowed_attention.py). -1 above the diagonal."""
    dims = ModelDims(n_embd=4, n_head=1, head_dim=4, train_seq_len=TRAIN_LEN, init_std=0.02)
    pe = RotaryPositionalEncoding(RoPEConfig(base=1e8, remap=remap), dims)
    e1, e3 = (torch.eye(4, dtype=torch.float64)[c].expand(1, 1, T, 4) for c in (1, 3))
    q, k_cos = pe.rotate(e1, e1, torch.arange(T), T)
    _, k_sin = pe.rotate(e3, e3, torch.arange(T), T)
    angles = [
        torch.atan2(q[..., s] @ k_sin[..., s].mT, q[..., s] @ k_cos[..., s].mT)[0, 0]
        for s in (slice(0, 4), slice(4, 8))
    ]
    near, far = (angle / 1e-4 for angle in angles)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    return torch.where(i - j < pe.score_window(), near, far).round().long().masked_fill(j > i, -1)


def string_distance(window: int, local_window: int):
    return lambda i, j: i - j if i - j < window else i - j - window + local_window


@pytest.mark.parametrize(("W", "w", "T"), CASES)
def test_relative_positions_are_the_references_index_mapping(W, w, T):
    want, diagonal, shifted = reference_distances(T, W, w)
    got = posgpt_distances(string(W, w), T)
    assert torch.equal(got, want)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    assert torch.equal(got[diagonal & ~shifted], (i - j).expand(T, T)[diagonal & ~shifted])
    assert torch.equal(got[shifted], (i - W + w - j).expand(T, T)[shifted])
    assert torch.equal(diagonal & shifted, (i - j == W).expand(T, T))  # the prefill's pairs scored twice
    assert got.max() == T - 1 - W + w


@pytest.mark.parametrize(("W", "w", "T"), CASES)
def test_every_row_is_the_references_decoding_step(W, w, T):
    """posgpt's whole forward, row t, against the reference's cached step of token t over tokens 0 .. t (t >= W);
    rows before W against its prefill, whose rows there are plain RoPE."""
    q, k, v = qkv(T, seed=0)
    got, _ = posgpt_attention(scheme(string(W, w)), q, k, v)
    for t in range(W, T):
        want = string_decode_reference(q[..., : t + 1, :], k[..., : t + 1, :], v[..., : t + 1, :], W, w)
        torch.testing.assert_close(got[..., t : t + 1, :], want, **LOOSE)
    torch.testing.assert_close(got[..., :W, :], string_prefill_reference(q, k, v, W, w)[..., :W, :], **LOOSE)


@pytest.mark.parametrize(("W", "w", "T"), CASES)
def test_the_references_prefill_is_posgpts_but_for_the_pair_it_scores_twice(W, w, T):
    """Its diagonal part's window, inclusive, holds i - j = W, which its shifted part holds too. With that window
    one shorter (window_size=[diag_size - 1, 0]) the prefill is posgpt's forward; as written, rows from W on differ."""
    q, k, v = qkv(T, seed=1)
    got, _ = posgpt_attention(scheme(string(W, w)), q, k, v)
    torch.testing.assert_close(got, string_prefill_reference(q, k, v, W, w, window_left=W - 1), **LOOSE)
    as_written = string_prefill_reference(q, k, v, W, w)
    differs = (got - as_written).abs().amax(dim=(0, 1, 3)) > 1e-3
    assert not differs[:W].any() and differs[W:].all()


def test_the_attention_factor_is_the_references_and_switches_off():
    """By default every logit is the reference's, a^2 = 1.1434 times the remap's alone; a factor of 1 gives the
    reference with its factor left out, and the two differ."""
    W, w, T = CASES[0]
    q, k, v = qkv(T, seed=4)
    assert STRING_ATTENTION_FACTOR == REFERENCE_FACTOR and round(REFERENCE_FACTOR**2, 4) == 1.1434
    with_factor, _ = posgpt_attention(scheme(string(W, w)), q, k, v)
    without, _ = posgpt_attention(scheme(string(W, w, 1.0)), q, k, v)
    torch.testing.assert_close(
        with_factor[..., W:, :], string_prefill_reference(q, k, v, W, w, W - 1)[..., W:, :], **LOOSE
    )
    want = string_prefill_reference(q, k, v, W, w, W - 1, factor=1.0)
    torch.testing.assert_close(without, want, **LOOSE)
    assert (with_factor - without).abs().max() > 1e-2


@pytest.mark.parametrize(("W", "w", "T"), CASES)
def test_string_equals_its_distance_formula_pair_by_pair(W, w, T):
    q, k, v = qkv(T, seed=2)
    want, want_probs = pairwise_attention(q, k, v, torch.arange(T), string_distance(W, w))
    got, got_probs = posgpt_attention(scheme(string(W, w, 1.0)), q, k, v)
    torch.testing.assert_close(got, want, **LOOSE)
    torch.testing.assert_close(got_probs.double(), want_probs, **LOOSE)


def test_with_explicit_positions_the_shift_is_by_position():
    q, k, v = qkv(12, seed=3)
    positions = torch.tensor([0, 1, 3, 4, 9, 10, 11, 17, 18, 30, 31, 40])
    want, _ = pairwise_attention(q, k, v, positions, string_distance(6, 2))
    got, _ = posgpt_attention(scheme(string(6, 2, 1.0)), q, k, v, positions=positions)
    torch.testing.assert_close(got, want, **LOOSE)


@torch.no_grad()
def test_a_window_covering_the_sequence_is_plain_rope():
    tokens = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    plain = tiny_model(train_len=32)(tokens)
    torch.testing.assert_close(tiny_model(string(24, 4, 1.0), train_len=32)(tokens), plain, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(tiny_model(string(8, 4), train_len=32)(tokens), plain, rtol=1e-5, atol=1e-5)


def test_cached_decoding_equals_a_full_forward_beyond_the_window():
    tokens = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(1))
    model = tiny_model(string(6, 2))
    with torch.no_grad():
        full = model(tokens)
    for prompt in (1, 9):
        torch.testing.assert_close(cached_logits(model, tokens, prompt), full, rtol=1e-5, atol=1e-5)


# --- Labels, settings, refusals ---------------------------------------------------------------------------------


def test_label_and_parse_round_trip():
    cfg = RotaryPositionalEncoding.config_class()
    settings = RotaryPositionalEncoding.parse_variation(" string : 21 : 4 ", cfg)
    assert settings == {"remap": resolved_string(21, 4)}
    assert RotaryPositionalEncoding.variation_label(settings) == "string:21:4"
    plain = {"remap": {"type": "string", "window": 21, "group": None, "leaky_factor": None, "local_window": 4}}
    plain["remap"]["attention_factor"] = REFERENCE_FACTOR
    assert RotaryPositionalEncoding.variation_label(plain) == "string:21:4"  # as result rows hold it
    del plain["remap"]["attention_factor"]  # a row scored before the factor was applied: without it
    assert RotaryPositionalEncoding.variation_label(plain) == "string:21:4:1"
    off = RotaryPositionalEncoding.parse_variation("string:21:4:1", cfg)
    assert off == {"remap": string(21, 4, 1.0)} and RotaryPositionalEncoding.variation_label(off) == "string:21:4:1"
    labels = [label for label, _ in scheme(RoPERemapConfig()).eval_variations(["none", "string:21:4", "rerope:8"])]
    assert labels == ["", "string:21:4", "rerope:8"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("string:8", "is not string:W:w"),
        ("string:8:2:1:3", "is not string:W:w"),
        ("string:8:2:0", "attention_factor=0.0 is out of its domain"),
        ("string:8:two", "is not string:W:w"),
        ("string:8:8", "local_window=8 must be smaller than window=8"),
        ("string:8:-1", "local_window=-1 is out of its domain [0, inf)"),
    ],
)
def test_malformed_entries_are_refused(spec, message):
    with pytest.raises(PosGPTError, match=re.escape(message)):
        RotaryPositionalEncoding.check_variations(RotaryPositionalEncoding.config_class(), [spec])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["pe.remap.type=string", "pe.remap.window=8"], "type string needs local_window"),
        (["pe.remap.type=rerope", "pe.remap.window=8", "pe.remap.local_window=2"], "local_window is a setting of"),
        (["pe.remap.type=none", "pe.remap.window=8"], "window is a setting of type self_extend, rerope and string"),
    ],
)
def test_settings_that_mean_nothing_are_refused_with_the_config(overrides, message):
    with pytest.raises(PosGPTError, match=re.escape(message)):
        validate(compose_config(["pe=rope", *overrides]))


def test_a_window_as_long_as_the_training_length_is_refused():
    with pytest.raises(PosGPTError, match="window=64 must be shorter than the training length 64"):
        scheme(string(64, 2), train_len=64)


@pytest.mark.parametrize("pe", ["rope", "p_rope"])
def test_a_run_configured_with_string_builds_and_evaluates_it(pe):
    cfg = compose_config([f"pe={pe}", "pe.remap.type=string", "pe.remap.window=8", "pe.remap.local_window=2"])
    validate(cfg)
    model = build_model(cfg)
    assert model.pe.score_window() == 8 and model.pe.current_variation() == "string:8:2"
    assert model.pe.cfg.remap.attention_factor == REFERENCE_FACTOR  # resolved, so the rows record it
    validate(compose_config([f"pe={pe}", "eval.variations=[none,string:21:4]"]))


def test_result_rows_from_before_local_window_existed_keep_their_identity():
    """A self_extend or rerope row written before STRING's setting existed lacks it; the same measurement made now
    holds it as null: either replaces the other, in perplexity rows and task rows alike."""
    from evaluation import store as results
    from evaluation import task_accuracy
    from evaluation.store import row_key

    before = {"type": "rerope", "window": 8, "group": None, "leaky_factor": None}
    now = {**before, "local_window": None, "attention_factor": None}
    rows = [{"variation_settings": {"remap": remap}} for remap in (before, now)]
    assert results.settings_identity(rows[0]) == results.settings_identity(rows[1])
    task_rows = [{**row, "task": "passkey", "length": 64} for row in rows]
    assert row_key(task_rows[0], task_accuracy.TASK_ROWS) == row_key(task_rows[1], task_accuracy.TASK_ROWS)
    # a STRING row scored before its attention factor was applied is another measurement than one scored with it
    old = {"type": "string", "window": 8, "group": None, "leaky_factor": None, "local_window": 2}
    new = {**old, "attention_factor": REFERENCE_FACTOR}
    rows = [{"variation_settings": {"remap": remap}} for remap in (old, new)]
    assert results.settings_identity(rows[0]) != results.settings_identity(rows[1])


@pytest.mark.slow
def test_eval_scores_string_as_a_variation(cli):
    """eval.py on an untrained tiny RoPE run (trained at 16): STRING's rows beside the run as trained, each
    labelled and with its settings, its attention written out."""
    run = make_run(cli.base / "string-rope-run", cli.corpus, "pe=rope")
    done = cli.eval_here(
        run,
        "eval.variations=[none,string:8:2]",
        "eval.lengths=[16,32]",
        "eval.max_tokens=128",
        "eval.protocols=[nonoverlapping]",
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads((run / "eval" / "extrapolation.json").read_text())["results"]
    string_rows = [row for row in rows if row["variation"] == "string:8:2"]
    assert len(string_rows) == 2 and all(
        row["ppl"] is not None and row["attn_backend"] == "math" for row in string_rows
    )
    assert string_rows[0]["variation_settings"]["remap"] == {
        "type": "string",
        "window": 8,
        "group": None,
        "leaky_factor": None,
        "local_window": 2,
        "attention_factor": REFERENCE_FACTOR,
    }
    plain = {row["length"]: row["ppl"] for row in rows if row["variation"] == ""}
    assert all(row["ppl"] != plain[row["length"]] for row in string_rows)  # applied (an untrained model: slightly)
