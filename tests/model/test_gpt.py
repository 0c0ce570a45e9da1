"""The GPT: causality for every scheme and backend, backends agree, cached decoding equals a full forward."""

import math
import re

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from core.errors import PosGPTError
from model import GPT, KVCache, ModelConfig
from model.pe import SCHEMES, PositionalEncoding
from model.pe import capabilities as cap
from model.sampling import generate

SEQ_LEN = 16


def pe_config(name):
    return SCHEMES[name].config_class()


def tiny(name, backend="math", seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layer=2, n_head=4, n_embd=32, vocab_size=300, attn_backend=backend, **overrides)
    return GPT(cfg, pe_config(name), train_seq_len=SEQ_LEN).eval()


ALL = sorted(SCHEMES)
CPU_BACKENDS = ["math", "sdpa"]


def test_vocab_padded_and_head_tied():
    model = tiny("rope")
    assert model.token_embedding.weight.shape[0] == 320  # 300 -> multiple of 64
    assert model.head_weight.data_ptr() == model.token_embedding.weight.data_ptr()
    assert model(torch.zeros(1, 4, dtype=torch.long)).shape == (1, 4, 300)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", ALL)
def test_changing_token_t_never_changes_earlier_outputs(name, backend):
    model = tiny(name, backend)
    idx = torch.randint(0, 300, (2, SEQ_LEN))
    changed = idx.clone()
    t = 9
    changed[:, t] = (changed[:, t] + 1) % 300
    a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :t], b[:, :t], rtol=0, atol=1e-6)
    assert (a[:, t:] - b[:, t:]).abs().max() > 1e-4  # the change is seen from t on


@pytest.mark.parametrize("name", ALL)
def test_sdpa_backend_matches_math_forward_and_backward(name):
    idx = torch.randint(0, 300, (2, SEQ_LEN))
    results = []
    for backend in CPU_BACKENDS:
        model = tiny(name, backend).train()
        loss = model(idx, idx)
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss_a, grads_a), (loss_b, grads_b) = results
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-5, atol=1e-6)
    for n in grads_a:
        torch.testing.assert_close(grads_a[n], grads_b[n], rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize("name", ALL)
def test_blockwise_bias_path_matches_math_at_long_length(name, monkeypatch):
    """The sdpa path materialises bias in query blocks; force tiny blocks and compare with the formula."""
    import model.attention as attention

    monkeypatch.setattr(attention, "_MAX_BLOCK_SCORES", 2 * 4 * 40 * 3)  # several blocks of queries
    idx = torch.randint(0, 300, (2, 40))
    name_ok = name != "learned"
    if not name_ok:
        pytest.skip("learned cannot encode 40 positions")
    torch.testing.assert_close(tiny(name, "sdpa")(idx), tiny(name, "math")(idx), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", ALL)
def test_cached_decoding_equals_full_forward(name, backend):
    model = tiny(name, backend)
    idx = torch.randint(0, 300, (2, SEQ_LEN))
    full = model(idx)
    cache = KVCache()
    pieces = [model(idx[:, :5], cache=cache)] + [model(idx[:, i : i + 1], cache=cache) for i in range(5, SEQ_LEN)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-4, atol=1e-5)


def test_generate_uses_the_cache_consistently():
    model = tiny("alibi", "sdpa")
    prompt = torch.randint(0, 300, (1, 4))
    out = generate(model, prompt, max_new_tokens=6, top_k=1)
    # greedy decoding with the cache equals greedy decoding by repeated full forwards
    expected = prompt
    for _ in range(6):
        expected = torch.cat([expected, model(expected)[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(out, expected)


def test_learned_beyond_its_table_is_a_clear_error():
    model = tiny("learned")
    with pytest.raises(PosGPTError, match="at most 16 positions"):
        model(torch.zeros(1, SEQ_LEN + 1, dtype=torch.long))


@pytest.mark.parametrize("name", [n for n in ALL if n != "learned"])
def test_other_schemes_run_beyond_training_length(name):
    out = tiny(name, "sdpa")(torch.zeros(1, 4 * SEQ_LEN, dtype=torch.long))
    assert torch.isfinite(out).all()


def test_bad_shapes_are_user_errors():
    with pytest.raises(PosGPTError, match="divisible"):
        GPT(ModelConfig(n_embd=30, n_head=4), pe_config("none"), SEQ_LEN)
    with pytest.raises(PosGPTError, match="attn_backend"):
        GPT(ModelConfig(attn_backend="fast"), pe_config("none"), SEQ_LEN)


# --- The real vocabulary: no path gives probability to the 20 padding rows (300 -> 320) ---------------------

VOCAB = 300


def with_loud_padding(model):
    """Long padding rows: a path that let them into a softmax would put most probability there."""
    with torch.no_grad():
        model.token_embedding.weight[VOCAB:] = 10 * torch.randn_like(model.token_embedding.weight[VOCAB:])
    return model


@pytest.mark.parametrize("fused_ce", ["always", "never"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_forward_loss_is_cross_entropy_over_the_real_vocabulary(reduction, fused_ce):
    model = with_loud_padding(tiny("rope", fused_ce=fused_ce)).double().train()
    idx = torch.randint(0, VOCAB, (2, SEQ_LEN))
    targets = torch.randint(0, VOCAB, (2, SEQ_LEN))
    targets[0, :3] = -100
    logits = model(idx)
    assert logits.shape[-1] == VOCAB
    want = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction=reduction)
    for grad in (True, False):  # the training paths, then the no-grad chunked path of evaluation
        with torch.set_grad_enabled(grad):
            got = model(idx, targets, reduction=reduction)
        torch.testing.assert_close(
            got, want.view_as(got).detach() if reduction == "none" else want.detach(), rtol=1e-6, atol=1e-6
        )


def test_generate_never_samples_padding():
    model = with_loud_padding(tiny("rope"))
    out = generate(
        model, torch.randint(0, VOCAB, (4, 2)), max_new_tokens=SEQ_LEN - 2, generator=torch.Generator().manual_seed(0)
    )
    assert out.max() < VOCAB


# --- The token-embedding convention (model.embedding), shared by every scheme ------------------------------


def first_block_input(model, idx):
    seen = []
    handle = model.blocks[0].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    model(idx)
    handle.remove()
    return seen[0]


@pytest.mark.parametrize("embedding, std, multiplier", [("fairseq", 32**-0.5, 32**0.5), ("gpt2", 0.02, 1.0)])
def test_token_embedding_convention(embedding, std, multiplier):
    """fairseq: table N(0, d^-1/2), looked-up rows times sqrt(d); gpt2: N(0, 0.02), as is. The tied head uses the
    table as is under both. 320 x 32 samples: the sample std is within 2% of the true one (5 standard errors)."""
    model = tiny("none", embedding=embedding)
    table = model.token_embedding.weight
    assert table.std().item() == pytest.approx(std, rel=0.02)
    idx = torch.randint(0, VOCAB, (2, SEQ_LEN))
    torch.testing.assert_close(first_block_input(model, idx), table[idx] * multiplier)
    torch.testing.assert_close(model(idx), model.hidden_states(idx) @ table[:VOCAB].t())


def test_fairseq_convention_gives_tokens_and_unscaled_sinusoid_comparable_size():
    """The point of the convention (Vaswani et al.; fairseq): token signal RMS ~1, the sinusoid's 1/sqrt(2)."""
    model = tiny("sinusoidal", embedding="fairseq")
    tokens = model.token_embedding.weight[:VOCAB] * math.sqrt(32)
    positions = model.pe.embed(torch.arange(SEQ_LEN))
    assert tokens.pow(2).mean().sqrt().item() == pytest.approx(1.0, rel=0.05)
    assert positions.pow(2).mean().sqrt().item() == pytest.approx(2**-0.5, rel=0.05)


@pytest.mark.parametrize("embedding", ["fairseq", "gpt2"])
@pytest.mark.parametrize("name", ALL)
def test_every_scheme_trains_under_both_conventions(name, embedding):
    model = tiny(name, "sdpa", embedding=embedding).train()
    idx = torch.randint(0, VOCAB, (2, SEQ_LEN))
    loss = model(idx, idx)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_unknown_convention_and_fused_mode_are_user_errors():
    with pytest.raises(PosGPTError, match="model.embedding"):
        GPT(ModelConfig(embedding="bert"), pe_config("none"), SEQ_LEN)
    with pytest.raises(PosGPTError, match="model.fused_ce"):
        GPT(ModelConfig(fused_ce="sometimes"), pe_config("none"), SEQ_LEN)


@pytest.mark.parametrize("name", ALL)
def test_capture_attention_records_every_layer_without_changing_the_output(name):
    model = tiny(name, "sdpa")
    idx = torch.randint(0, 300, (2, SEQ_LEN))
    plain = model(idx)
    probs = []
    captured = model(idx, capture=probs)
    torch.testing.assert_close(captured, plain, rtol=1e-4, atol=1e-5)
    assert len(probs) == 2 and all(p.shape == (2, 4, SEQ_LEN, SEQ_LEN) and p.dtype == torch.float32 for p in probs)
    for p in probs:
        if "weights" in getattr(SCHEMES[name], "modifies", ()):  # its own weights: a row sums to at most 1
            assert (p >= 0).all() and (p.sum(-1) <= 1 + 1e-6).all()
        else:
            torch.testing.assert_close(p.sum(-1), torch.ones(2, 4, SEQ_LEN))
        assert (p.triu(diagonal=1) == 0).all()


def test_position_state_is_prepared_once_per_forward(monkeypatch):
    """RoPE's cos/sin: one computation per forward pass, not one per layer."""
    model = tiny("rope")
    calls = []
    original = type(model.pe).cos_sin
    monkeypatch.setattr(type(model.pe), "cos_sin", lambda self, *a: calls.append(1) or original(self, *a))
    model(torch.zeros(1, 8, dtype=torch.long))
    assert len(calls) == 1


def test_weight_decay_follows_the_scheme_declaration():
    from omegaconf import OmegaConf

    from experiment.config import TrainConfig
    from experiment.plan import section_settings
    from training.optim import OptimizerSettings, build_optimizer

    model = tiny("t5")
    settings = section_settings(OptimizerSettings, OmegaConf.structured(TrainConfig()))
    optimizer = build_optimizer(model, settings, torch.device("cpu"))
    decayed = {id(p) for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert id(model.pe.table) not in decayed
    assert id(model.token_embedding.weight) in decayed
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))


@pytest.mark.parametrize("name", [n for n in ALL if issubclass(SCHEMES[n], cap.ScoreBias)])
def test_bias_is_built_once_per_forward_unless_it_depends_on_the_layer(name, monkeypatch):
    model = tiny(name, "sdpa")
    calls = []
    original = type(model.pe).bias_block
    monkeypatch.setattr(type(model.pe), "bias_block", lambda self, *a: calls.append(1) or original(self, *a))
    model(torch.zeros(1, 8, dtype=torch.long))
    assert len(calls) == (2 if issubclass(SCHEMES[name], cap.LayerwiseBias) else 1)


def test_presentation_study_variations_and_migration_live_outside_the_schemes():
    """Colours and table names belong to plots and tables (evaluation/schemes.py), study variations to the study
    (scripts/study_variations.py), checkpoint migration to the loader (experiment/settings.py): every name they list
    is a scheme, and a scheme's class holds its mathematics alone."""
    from study_variations import STUDY_VARIATIONS

    from evaluation.plots import scheme_colour
    from evaluation.schemes import COLOURS, DISPLAY_NAMES, display_name
    from experiment.settings import LEGACY_PE_VALUES

    assert set(COLOURS) | set(DISPLAY_NAMES) | set(STUDY_VARIATIONS) | set(LEGACY_PE_VALUES) <= set(SCHEMES)
    # a scheme without an entry (one added later) is drawn in a colour of its own, made from its name
    assert all(re.fullmatch(r"#[0-9a-f]{6}", scheme_colour(name)) for name in SCHEMES)
    assert scheme_colour("myscheme") == scheme_colour("myscheme") not in COLOURS.values()
    assert display_name("myscheme") == "myscheme" and display_name("none") == "none (NoPE)"
    for attribute in ("colour", "display_name", "study_variations", "legacy_values"):
        assert not hasattr(PositionalEncoding, attribute), attribute


def test_every_flag_is_an_interface():
    """A scheme says what it does by the interfaces it inherits (model/pe/capabilities.py); no flag is declared."""
    flags = ("has_score_bias", "bias_is_relative", "bias_depends_on_layer", "score_mod_compiles", "has_content_bias")
    flags += ("has_cumulative_bias", "has_attention_weights", "has_transitions")
    for name, scheme in SCHEMES.items():
        assert not any(hasattr(scheme, flag) for flag in flags), name
    with pytest.raises(TypeError, match="ScoreBias"):

        class Unread(PositionalEncoding):  # a hook written without its interface would never run
            def score_bias(self, q_pos, k_pos, head, layer):
                return q_pos - k_pos


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_every_study_variation_is_one_its_scheme_accepts(name):
    """scripts/study.sh evaluates every run with its scheme's study_variations: each passes the scheme's own check
    at the default config and gives a change of its settings (a study would otherwise fail after training)."""
    from omegaconf import OmegaConf
    from study_variations import STUDY_VARIATIONS

    from experiment.compose import compose_config

    variations = list(STUDY_VARIATIONS.get(name, ()))
    cfg = OmegaConf.to_object(compose_config([f"pe={name}"])).pe
    SCHEMES[name].check_variations(cfg, variations)
    assert all(SCHEMES[name].parse_variation(spec, cfg) for spec in variations)


# CUDA's linear algebra has no bfloat16 or float16 kernel for its factorisations and solves (matmul, norms and
# products have them); an aten op named with one of these words is one of them.
FLOAT32_ONLY_ON_CUDA = {"solve", "cholesky", "inverse", "inv", "lu", "qr", "geqrf", "ormqr", "householder", "eig"}
FLOAT32_ONLY_ON_CUDA |= {"eigh", "svd", "det", "slogdet", "lstsq", "pinv"}


class NoReducedPrecisionLinearAlgebra(TorchDispatchMode):
    """Fails where an op that CUDA has only in float32 or float64 gets a bfloat16 or float16 tensor: what a GPU run
    under bf16 autocast would refuse, seen on a CPU (whose kernels take bf16), forward and backward."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.removeprefix("aten::")
        if FLOAT32_ONLY_ON_CUDA & set(name.split("_")):
            tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            reduced = [t.dtype for t in tensors if t.dtype in (torch.bfloat16, torch.float16)]
            assert not reduced, f"{name} on {reduced[0]}: CUDA has no such kernel"
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ALL)
def test_under_bfloat16_autocast_no_scheme_asks_for_linear_algebra_that_cuda_lacks(name):
    """Every scheme's written-out path, which a GPU runs for a KV cache, captured probabilities or a sink, trained and
    decoded under bf16 autocast (PaTH's triangular solve took bf16 products on an H200 and failed)."""
    model = tiny(name, "math").train()
    idx = torch.randint(0, 300, (2, SEQ_LEN), generator=torch.Generator().manual_seed(0))
    with NoReducedPrecisionLinearAlgebra():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(idx, idx)
        loss.backward()
        model.eval()
        cache = KVCache()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            model(idx[:, :5], cache=cache)
            model(idx[:, 5:6], cache=cache)
