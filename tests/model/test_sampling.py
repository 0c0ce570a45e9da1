"""Sampling (model/sampling.py, sample.py): cached decoding equals a full forward for every scheme and RoPE
scaling, also past the training length; seeds and greedy decoding are deterministic; the CLI's refusals."""

from __future__ import annotations

import sys

import pytest
import torch
from cli_runs import Runner
from tiny_checkpoint import make_run

from core.errors import PosGPTError
from model import GPT, KVCache, ModelConfig
from model.pe import SCHEMES
from model.pe.rope_scaling import ROPE_SCALINGS, RoPEScalingConfig
from model.sampling import generate

SEQ_LEN = 16
VOCAB = 300  # padded to 320 inside the model


def variants() -> list[tuple[str, str | None]]:
    """Every scheme in model/pe/, and every RoPE-style scaling of those that have one (factor 4; a sliding window's
    RoPE has the setting but no distance to extend, and refuses it)."""
    out = []
    for name, scheme in sorted(SCHEMES.items()):
        if "scaling" in scheme.eval_time_settings:
            out += [(name, kind) for kind in ROPE_SCALINGS]
        else:
            out.append((name, None))
    return out


VARIANTS = variants()
IDS = [f"{name}-{scaling}" if scaling else name for name, scaling in VARIANTS]


def tiny(name: str, scaling: str | None, seed: int = 0) -> GPT:
    """Untrained, but with weights large enough that attention is far from uniform: position matters."""
    torch.manual_seed(seed)
    pe = SCHEMES[name].config_class()
    if scaling is not None:
        pe.scaling = RoPEScalingConfig(type=scaling, factor=1.0 if scaling == "none" else 4.0)
        if scaling == "longrope":  # one factor per pair (head_dim 8): 1 to 4 from the fastest to the slowest
            pe.scaling.short_factor, pe.scaling.long_factor = [1.0, 1.0, 1.1, 1.2], [1.0, 1.5, 2.5, 4.0]
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=16, vocab_size=VOCAB, init_std=0.3)
    return GPT(cfg, pe, train_seq_len=SEQ_LEN).eval()


def longest(model: GPT) -> int:
    """3x the training length, or what the scheme can encode."""
    return min(3 * SEQ_LEN, model.pe.max_positions() or 3 * SEQ_LEN)


def causal_dynamic_forward(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """The full forward that decoding with dynamic NTK must equal, written out: in every layer, query i and
    the keys it sees are rotated with the frequencies for length i + 1 (the length when token i was read).
    Up to the training length that is the ordinary forward; past it, a plain forward over x[:t+1] would rotate
    the keys of *earlier layers' earlier tokens* with freq(t + 1) too, which no decoder can do incrementally."""
    x = model.token_embedding(idx) * model.token_scale
    B, T, C = x.shape
    for block in model.blocks:
        attn = block.attn
        q, k, v = (t.view(B, T, attn.n_head, -1).transpose(1, 2) for t in attn.qkv(block.ln_1(x)).split(C, dim=2))
        rows = []
        for i in range(T):
            qi, ki = model.pe.rotate(q[:, :, : i + 1], k[:, :, : i + 1], torch.arange(i + 1), i + 1)
            weights = torch.softmax(qi[:, :, -1:] @ ki.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)
            rows.append(weights @ v[:, :, : i + 1])
        x = x + attn.proj(torch.cat(rows, dim=2).transpose(1, 2).reshape(B, T, C))
        x = x + block.mlp(block.ln_2(x))
    return (model.ln_f(x) @ model.head_weight.t())[..., :VOCAB]


@pytest.mark.parametrize(("name", "scaling"), VARIANTS, ids=IDS)
@torch.inference_mode()
def test_cached_decoding_equals_a_full_forward_token_by_token(name, scaling):
    model = tiny(name, scaling)
    idx = torch.randint(0, VOCAB, (1, longest(model)))
    cache = KVCache()
    cached = [model(idx[:, :5], cache=cache)[:, -1]]
    cached += [model(idx[:, t : t + 1], cache=cache)[:, -1] for t in range(5, idx.shape[1])]
    dynamic = model.paths_on(idx.device)[0].rotate_cached_keys  # the rotation depends on the length
    reference = causal_dynamic_forward(model, idx) if dynamic else None
    for t, logits in enumerate(cached, start=4):  # the logits after token t
        expected = reference[:, t] if dynamic else model(idx[:, : t + 1])[:, -1]
        torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4, msg=f"t={t}")


@torch.inference_mode()
def test_the_dynamic_ntk_reference_is_the_plain_forward_within_the_training_length_only():
    """So the reference above is neither trivially the plain forward nor unrelated to it."""
    model = tiny("rope", "dynamic_ntk")
    idx = torch.randint(0, VOCAB, (1, 2 * SEQ_LEN))
    reference = causal_dynamic_forward(model, idx)
    torch.testing.assert_close(reference[:, :SEQ_LEN], model(idx[:, :SEQ_LEN]), rtol=1e-4, atol=1e-4)
    assert (reference[:, -1] - model(idx)[:, -1]).abs().max() > 1e-3


@pytest.mark.parametrize(("name", "scaling"), VARIANTS, ids=IDS)
def test_greedy_is_deterministic_and_equals_repeated_full_forwards(name, scaling):
    model = tiny(name, scaling)
    prompt = torch.randint(0, VOCAB, (1, 4))
    steps = longest(model) - 4
    outs = [
        generate(model, prompt, steps, temperature=0, generator=torch.Generator().manual_seed(seed)) for seed in (0, 1)
    ]
    assert torch.equal(outs[0], outs[1])
    expected = prompt
    with torch.inference_mode():
        for _ in range(steps):
            expected = torch.cat([expected, model(expected)[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(outs[0], expected)


@pytest.mark.parametrize(("name", "scaling"), VARIANTS, ids=IDS)
def test_a_fixed_seed_gives_the_same_text(name, scaling):
    model = tiny(name, scaling)
    prompt = torch.randint(0, VOCAB, (1, 4))

    def draw(seed: int) -> torch.Tensor:
        return generate(
            model, prompt, longest(model) - 4, temperature=1.0, top_k=50, generator=torch.Generator().manual_seed(seed)
        )

    first = draw(0)
    assert torch.equal(first, draw(0))
    assert not torch.equal(first, draw(1))


def test_only_the_real_vocabulary_is_drawn(monkeypatch):
    """Even from logits over the padded embedding (as a kernel may return them), padding ids never come out."""
    model = tiny("alibi", None)
    forward = model.forward

    def padded_forward(idx, **kwargs):
        logits = forward(idx, **kwargs)
        return torch.cat([logits, torch.full((*logits.shape[:-1], 20), 1e4)], dim=-1)  # padding wins if seen

    monkeypatch.setattr(model, "forward", padded_forward)
    out = generate(model, torch.zeros(1, 1, dtype=torch.long), 30, temperature=0.0)
    assert out.max() < VOCAB
    out = generate(
        model, torch.zeros(1, 1, dtype=torch.long), 30, temperature=5.0, generator=torch.Generator().manual_seed(0)
    )
    assert out.max() < VOCAB


def test_learned_beyond_its_table_is_refused_before_generating():
    model = tiny("learned", None)
    with pytest.raises(PosGPTError, match="at most 16 positions"):
        generate(model, torch.zeros(1, 4, dtype=torch.long), SEQ_LEN - 3, temperature=0)


# --- the command line ---


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    runner = Runner(tmp_path_factory.getbasetemp())
    base = tmp_path_factory.mktemp("sample")
    return runner, {pe: make_run(base / pe, runner.corpus, f"pe={pe}") for pe in ("rope", "learned")}


def sample_main(capsys, *argv: str) -> tuple[int, str, str]:
    import sample

    code = 0
    try:
        sample.main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_cli_samples_past_the_training_length_with_yarn(runs):
    runner, run_dirs = runs
    done = runner.run(
        [
            sys.executable,
            "sample.py",
            f"run_dir={run_dirs['rope']}",
            "sample.prompt=def main",
            "sample.max_new_tokens=40",
            "sample.num_samples=2",
            "sample.seed=0",
            "pe.scaling.type=yarn",
            "pe.scaling.factor=4",
        ]
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(" sample ") == 2, done.stdout
    assert [line for line in done.stdout.splitlines() if line.startswith("def main")], done.stdout
    assert "yarn:4" in done.stderr and "40 new" in done.stderr


def test_a_seed_gives_the_same_text_through_the_cli_and_greedy_ignores_it(runs, capsys):
    run_dir = runs[1]["rope"]
    args = [f"run_dir={run_dir}", "sample.prompt='x = 1'", "sample.max_new_tokens=12", "sample.num_samples=2"]
    first = sample_main(capsys, *args, "sample.seed=3")
    assert first[0] == 0, first[2]
    samples = first[1].split("sample 2")
    assert samples[0].split("\n", 1)[1] != samples[1].split("\n", 1)[1]  # two draws differ
    assert sample_main(capsys, *args, "sample.seed=3")[1] == first[1]
    assert sample_main(capsys, *args, "sample.seed=4")[1] != first[1]
    greedy = [sample_main(capsys, *args, "sample.temperature=0") for _ in range(2)]
    assert greedy[0][0] == 0 and greedy[0][1] == greedy[1][1]


@pytest.mark.parametrize("setting", ["sample.seed=4", "sample.top_k=5"])
def test_greedy_decoding_refuses_the_sampling_settings_it_would_ignore(runs, capsys, setting):
    """sample.temperature=0 takes the most likely token: a seed or a top_k given with it would change nothing."""
    args = [f"run_dir={runs[1]['rope']}", "sample.max_new_tokens=4", "sample.temperature=0", setting]
    code, out, err = sample_main(capsys, *args)
    assert code == 2 and f"{setting} is read only when sampling" in err and "sample 1" not in out, err


@pytest.mark.parametrize("temperature", ["1e-40", "5e-324"])  # float32 overflows; the smallest positive double
def test_a_temperature_too_small_to_divide_by_is_greedy_decoding(runs, capsys, temperature):
    """Any temperature in the domain computes a distribution: one whose other tokens all underflow is greedy."""
    args = [f"run_dir={runs[1]['rope']}", "sample.prompt='x = 1'", "sample.max_new_tokens=12"]
    greedy = sample_main(capsys, *args, "sample.temperature=0")
    assert greedy[0] == 0, greedy[2]
    code, out, err = sample_main(capsys, *args, "sample.seed=3", f"sample.temperature={temperature}")
    assert (code, out) == greedy[:2], err


def test_the_largest_temperature_draws_from_the_whole_vocabulary(runs, capsys):
    """1e308 divides every gap to about 0: a uniform draw, not a nan."""
    args = [f"run_dir={runs[1]['rope']}", "sample.max_new_tokens=12", "sample.top_k=null"]
    code, out, err = sample_main(capsys, *args, "sample.temperature=1e308")
    assert code == 0, err
    assert len(set(out.splitlines()[-1].split())) > 6, out  # an untrained model's greedy text repeats a token


@pytest.mark.parametrize(
    ("pe", "args", "message"),
    [
        ("learned", ["sample.max_new_tokens=20"], "encodes at most 16 positions"),
        ("rope", ["model.n_layer=2"], "model.n_layer cannot be changed for an evaluation"),
        ("rope", ["sample.temperature=-1"], "sample.temperature=-1.0 is out of its domain [0, inf)"),
        ("rope", ["sample.prompt=a", "sample.prompt_file=/nonexistent"], "not both"),
        ("rope", ["sample.prompt_file=/nonexistent"], "does not exist"),
    ],
)
def test_cli_refusals_are_one_clear_line(runs, capsys, pe, args, message):
    code, out, err = sample_main(capsys, f"run_dir={runs[1][pe]}", *args)
    assert code == 2 and message in err and "sample 1" not in out, err
