"""p-RoPE (model/pe/p_rope.py): its equation checked directly and against Hugging Face's "proportional" RoPE
(tests/support/reference), p = 1 is RoPE and p = 0 no rotation, scalings act on RoPE's frequencies before truncation,
refusals, and train.init_from in-process.

Covered elsewhere through the scheme registry: cached decoding equals a full forward for p_rope with every scaling
(test_sample.py, test_model.py), per-row randomized positions (test_random_positions.py), the backends
(test_backends.py, test_model.py) and a run through train.py and eval.py (test_cli_e2e.py).
"""

import math

import pytest
import torch
from cli_runs import TINY
from reference_numbers import REFERENCE_NUMBERS
from tiny_checkpoint import make_run

from core.errors import PosGPTError
from experiment.build import build_model
from experiment.compose import compose_config
from experiment.plan import load_parent
from model import GPT, ModelConfig
from model.pe import ModelDims
from model.pe.base import PEConfig
from model.pe.p_rope import PartialRotaryPositionalEncoding, PRoPEConfig, kept_pairs
from model.pe.rope import RoPEConfig, RotaryPositionalEncoding
from model.pe.rope_scaling import ROPE_SCALINGS, RoPEScalingConfig


def dims(head_dim=16, train_len=64):
    return ModelDims(n_embd=4 * head_dim, n_head=4, head_dim=head_dim, train_seq_len=train_len, init_std=0.02)


def p_rope(p=0.75, head_dim=16, scaling=None, base=10000.0, train_len=64):
    cfg = PRoPEConfig(p=p, base=base, scaling=scaling or RoPEScalingConfig())
    return PartialRotaryPositionalEncoding(cfg, dims(head_dim, train_len))


def rope(head_dim=16, scaling=None, train_len=64, **keys):
    cfg = RoPEConfig(scaling=scaling or RoPEScalingConfig(), **keys)
    return RotaryPositionalEncoding(cfg, dims(head_dim, train_len))


def example_scaling(kind: str, pairs: int) -> RoPEScalingConfig:
    """Each type with factor 4 (none: 1); longrope with one factor per pair, 1 (fastest) to 4 (slowest)."""
    if kind == "none":
        return RoPEScalingConfig()
    if kind == "longrope":
        ramp = [4.0 ** (i / (pairs - 1)) for i in range(pairs)]
        return RoPEScalingConfig(kind, 4.0, short_factor=[1.0] * pairs, long_factor=ramp)
    return RoPEScalingConfig(kind, 4.0)


def test_the_kept_pairs_are_p_d_over_2_and_a_fraction_of_a_pair_is_refused():
    """Never rounded (the paper's listing and Hugging Face's round down: pe.p=0.3 would silently be 0.25)."""
    assert [kept_pairs(16, p) for p in (0.0, 0.25, 0.375, 0.5, 0.75, 1.0)] == [0, 2, 3, 4, 6, 8]
    assert kept_pairs(64, 0.75) == 24 and kept_pairs(10, 0.6) == 3
    with pytest.raises(
        PosGPTError, match=r"pe.p=0.3 keeps 2.4 of the 8 .* choose pe.p=0.25 \(2 pairs\) or 0.375 \(3\)"
    ):
        kept_pairs(16, 0.3)
    with pytest.raises(PosGPTError, match=r"pe.p=0.7 keeps 3.5 of the 5"):
        kept_pairs(10, 0.7)


@pytest.mark.parametrize("p, head_dim", [(0.75, 16), (0.75, 64), (0.25, 64), (0.375, 16)])
def test_angles_are_ropes_on_the_kept_pairs_and_zero_on_the_others(p, head_dim):
    """theta^p_i = base^(-2i/d) for i < floor(p d / 2), 0 after: cos 1 and sin 0 at every position there."""
    positions = torch.tensor([0, 1, 5, 63, 1000, 50_000])
    k, half = math.floor(p * head_dim / 2), head_dim // 2
    cos, sin = p_rope(p, head_dim).cos_sin(positions, 64)
    rope_cos, rope_sin = rope(head_dim).cos_sin(positions, 64)
    for i in range(half):
        for coordinate in (i, i + half):  # pair i is coordinates (i, i + d/2) in posgpt's layout
            if i < k:
                assert torch.equal(cos[:, coordinate], rope_cos[:, coordinate])
                assert torch.equal(sin[:, coordinate], rope_sin[:, coordinate])
                angles = positions.double() * 10000.0 ** (-2 * i / head_dim)
                torch.testing.assert_close(cos[:, coordinate].double(), angles.cos(), rtol=0, atol=1e-6)
            else:
                assert (cos[:, coordinate] == 1).all() and (sin[:, coordinate] == 0).all()


def test_truncated_pairs_pass_unchanged_and_their_dot_product_ignores_position():
    pe, half, k = p_rope(0.75, 16), 8, 6
    q, key = torch.randn(2, 4, 10, 16), torch.randn(2, 4, 10, 16)
    positions = torch.tensor([0, 3, 7, 20, 21, 22, 100, 101, 5000, 9000])
    rq, rk = pe.rotate(q, key, positions, 10)
    truncated = [*range(k, half), *range(half + k, 16)]
    assert torch.equal(rq[..., truncated], q[..., truncated]) and torch.equal(rk[..., truncated], key[..., truncated])
    # the kept pairs still turn, and preserve norms
    assert not torch.allclose(rq[..., :k], q[..., :k])
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))


@pytest.mark.parametrize("case", REFERENCE_NUMBERS["p_rope"], ids=lambda case: case["name"])
def test_frequencies_equal_hugging_faces_proportional_rope(case):
    """Hugging Face's "proportional" type (Gemma's p-RoPE); its factor divides every frequency: posgpt's linear. Where
    p d / 2 is not whole, Hugging Face rounds it down and posgpt refuses it."""
    scaling = RoPEScalingConfig("linear", case["factor"]) if case["factor"] != 1 else RoPEScalingConfig()
    if not float(case["p"] * case["head_dim"] / 2).is_integer():
        with pytest.raises(PosGPTError, match=f"pe.p={case['p']} keeps"):
            p_rope(case["p"], case["head_dim"], scaling, base=case["base"])
        return
    pe = p_rope(case["p"], case["head_dim"], scaling, base=case["base"])
    inv_freq, attention_factor = pe.frequencies(64)
    # Hugging Face computes in float32, posgpt in float64; the truncated pairs are exactly zero in both
    torch.testing.assert_close(inv_freq, torch.tensor(case["inv_freq"], dtype=torch.float64), rtol=1e-6, atol=0.0)
    assert attention_factor == case["attention_factor"] == 1.0


def tiny_gpt(pe_cfg: PEConfig, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=300, init_std=0.3)
    return GPT(cfg, pe_cfg, train_seq_len=16).eval()


@pytest.mark.parametrize("kind", sorted(ROPE_SCALINGS))
def test_p_one_is_rope_exactly(kind):
    idx = torch.randint(0, 300, (2, 40))
    scaling = example_scaling(kind, 8)
    want = tiny_gpt(RoPEConfig(scaling=scaling))(idx)
    torch.testing.assert_close(tiny_gpt(PRoPEConfig(p=1.0, scaling=scaling))(idx), want, rtol=0, atol=0)


def test_p_zero_is_no_rotation():
    q, k = torch.randn(2, 4, 10, 16), torch.randn(2, 4, 10, 16)
    rq, rk = p_rope(0.0).rotate(q, k, torch.arange(100, 110), 10)
    assert torch.equal(rq, q) and torch.equal(rk, k)
    idx = torch.randint(0, 300, (2, 40))
    torch.testing.assert_close(tiny_gpt(PRoPEConfig(p=0.0))(idx), tiny_gpt(PEConfig())(idx), rtol=0, atol=0)


def test_p_rope_is_not_neox_partial_rotary():
    """Same share of rotated coordinates, other frequencies: NeoX's r-dimensional spectrum reaches base^(-(r-2)/r)."""
    truncated = p_rope(0.5, 16).frequencies(64)[0]
    neox = rope(16, rotary_fraction=0.5).frequencies(64)[0]
    torch.testing.assert_close(truncated[:4], rope(16).frequencies(64)[0][:4])
    assert neox[-1].item() == pytest.approx(10000.0 ** (-6 / 8)) and truncated[3].item() == pytest.approx(10000**-0.375)


@pytest.mark.parametrize("kind", sorted(ROPE_SCALINGS))
def test_a_scaling_rewrites_ropes_frequencies_then_the_lowest_are_truncated(kind):
    """The decision (p_rope.py): a kept pair has its frequency under pe=rope with that scaling; the others stay 0
    (ntk and longrope recompute every frequency, which would otherwise turn the truncated pairs again)."""
    scaling = example_scaling(kind, 8)
    for seq_len in (64, 256):  # within and beyond L: dynamic_ntk and longrope change with the length
        inv_freq, factor = p_rope(0.75, 16, scaling).frequencies(seq_len)
        rope_freq, rope_factor = rope(16, scaling).frequencies(seq_len)
        assert torch.equal(inv_freq[:6], rope_freq[:6]) and (inv_freq[6:] == 0).all() and factor == rope_factor


def test_eval_time_scalings_apply_and_are_undone():
    pe = p_rope(0.75, 16)
    (label, settings), *_ = pe.eval_variations(["yarn:4"])
    before = pe.frequencies(64)[0]
    with pe.evaluated_with(settings):
        yarn = rope(16, RoPEScalingConfig("yarn", 4.0)).frequencies(64)[0]
        torch.testing.assert_close(pe.frequencies(64)[0][:6], yarn[:6])
    assert label == "yarn:4" and torch.equal(pe.frequencies(64)[0], before)


@pytest.mark.parametrize(
    "keys, message",
    [
        ({"p": 1.5}, r"p=1.5 is out of its domain \[0, 1\]"),
        ({"p": -0.1}, r"p=-0.1 is out of its domain \[0, 1\]"),
        ({"rotary_fraction": 0.5}, "pe=p_rope truncates frequencies, not dimensions"),
    ],
)
def test_refusals_are_one_line(keys, message):
    with pytest.raises(PosGPTError, match=message) as error:
        PartialRotaryPositionalEncoding(PRoPEConfig(**keys), dims())
    assert "\n" not in str(error.value)


def test_config_composes_with_the_papers_default():
    cfg = compose_config(["pe=p_rope"])
    assert cfg.pe.p == 0.75 and cfg.pe.name == "p_rope"
    assert build_model(compose_config(["pe=p_rope", "pe.p=0.5"])).pe.kept == 16  # model=default: head_dim 64


def test_init_from_a_p_rope_parent_keeps_its_weights_and_length(tmp_path):
    """In-process: a parent checkpoint at 16 tokens, a child at 32 with YaRN; the child gets the parent's
    weights and L = 16, so with the same scaling it computes exactly what its parent computes."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("unused: no data is read")
    parent_dir = make_run(tmp_path / "parent", corpus, "pe=p_rope", "pe.p=0.5")
    common = [*TINY, f"data.files=[{corpus}]", "pe=p_rope", "pe.p=0.5", "pe.scaling.type=yarn", "pe.scaling.factor=2"]
    child_cfg, parent = load_parent(compose_config([*common, f"train.init_from={parent_dir}", "train.seq_len=32"]))
    assert child_cfg.pe.scaling.original_seq_len == 16 and parent.seq_len == 16
    child = build_model(child_cfg).eval()
    parent.load_into(child, child_cfg.train.seq_len)
    scaled_parent = build_model(compose_config(common)).eval()
    scaled_parent.load_state_dict(torch.load(parent_dir / "checkpoints" / "last.pt", weights_only=True)["model"])
    idx = torch.randint(0, 200, (1, 48))
    torch.testing.assert_close(child(idx), scaled_parent(idx), rtol=0, atol=0)
    with pytest.raises(PosGPTError, match="pe.p=0.5 in .* but 0.75 here"):
        load_parent(compose_config([*TINY, f"data.files=[{corpus}]", "pe=p_rope", f"train.init_from={parent_dir}"]))
