"""Per-layer schemes (model/pe/hybrid.py): a pattern cycled over the layers, each scheme with its own settings, the
model handing every layer its scheme (PositionalEncoding.layer_schemes, model/gpt.py)."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from core.errors import PosGPTError
from experiment.compose import compose_config
from experiment.config import validate
from model import GPT
from model import kernels as kernels_module
from model.attention import default_state
from model.gpt import KVCache, ModelConfig
from model.pe import SCHEMES
from model.pe.hybrid import layer_scheme_names
from model.pe.rope_scaling import RoPEScalingConfig
from training.metrics import layer_schemes

VOCAB, SEQ_LEN = 101, 32
PARTS = layer_scheme_names()


def model_config(n_layer: int = 4, **overrides) -> ModelConfig:
    return ModelConfig(n_layer=n_layer, n_head=4, n_embd=32, vocab_size=VOCAB, **overrides)


def hybrid(pattern: list[str], n_layer: int = 4, seed: int = 0, scheme: str = "hybrid", **settings) -> GPT:
    cfg = SCHEMES[scheme].config_class(pattern=pattern, **settings)
    torch.manual_seed(seed)
    return GPT(model_config(n_layer), cfg, SEQ_LEN).eval()


def single(name: str, n_layer: int = 4, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(model_config(n_layer), SCHEMES[name].config_class(), SEQ_LEN).eval()


def test_the_schemes_a_pattern_holds_are_those_acting_in_attention():
    assert {"rope", "none", "alibi", "cope"} <= set(PARTS)
    assert not {"sinusoidal", "learned", "hybrid", "rnope", "llama4_inope"} & set(PARTS)


@pytest.mark.parametrize("name", PARTS)
@torch.no_grad()
def test_a_pattern_of_one_scheme_is_that_scheme_exactly(name):
    """The same parameters from the same seed (per-layer ones included: FIRE, KERPLE, CoPE) and the same logits."""
    idx = torch.randint(0, VOCAB, (2, 24))
    ours, theirs = hybrid([name], n_layer=3), single(name, n_layer=3)
    assert sorted(t.shape for t in ours.state_dict().values()) == sorted(t.shape for t in theirs.state_dict().values())
    assert torch.equal(ours(idx), theirs(idx))


def test_the_pattern_cycles_over_the_layers_and_each_scheme_counts_its_own_layers():
    model = hybrid(["fire", "rope"], n_layer=5)
    assert [(scheme.name, index) for scheme, index in model.layer_pe] == [
        ("fire", 0),
        ("rope", 0),
        ("fire", 1),
        ("rope", 1),
        ("fire", 2),
    ]
    assert len(model.pe.parts["fire"].layers) == 3  # FIRE's MLPs: one per layer it runs, not per model layer
    assert layer_schemes(model) == "[fire,rope,fire,rope,fire]"
    assert layer_schemes(single("rope")) == ""  # a single scheme: the run's line is as before


@torch.no_grad()
def test_each_layer_runs_its_own_scheme():
    """[rope, alibi] computes what layer 0 with RoPE then layer 1 with ALiBi compute, written out block by block."""
    model, idx = hybrid(["rope", "alibi"], n_layer=2), torch.randint(0, VOCAB, (2, 16))
    x = model.token_embedding(idx) * model.token_scale
    for layer, name in enumerate(["rope", "alibi"]):
        scheme = SCHEMES[name](SCHEMES[name].config_class(), model.pe.dims)
        kernel = kernels_module.choose_kernel(scheme, "auto", idx.device)
        x = model.blocks[layer](x, scheme, default_state(scheme, 16, 16, idx.device), None, layer, kernel)
    torch.testing.assert_close(model(idx), (model.ln_f(x) @ model.head_weight.t())[..., :VOCAB])


def test_a_bias_scheme_takes_the_bias_path_in_its_own_layers_only(monkeypatch):
    calls: list[str] = []
    blockwise = kernels_module.blockwise_sdpa
    monkeypatch.setattr(
        kernels_module, "blockwise_sdpa", lambda q, k, v, call: calls.append(call.pe.name) or blockwise(q, k, v, call)
    )
    model = hybrid(["rope", "rope", "rope", "alibi"], n_layer=4)
    with torch.no_grad():
        model(torch.randint(0, VOCAB, (1, 16)))
    assert calls == ["alibi"]  # the RoPE layers ran the fused causal kernel
    assert model.attention_backend(torch.device("cpu")) == "sdpa"


def test_each_scheme_has_its_own_settings_and_the_presets_theirs():
    model = hybrid(["rope", "none"], rope=SCHEMES["rope"].config_class(base=500.0))
    expected = single("rope").pe.inv_freq * 0 + 500.0 ** (-torch.arange(0, 8, 2, dtype=torch.float32) / 8)
    torch.testing.assert_close(model.pe.parts["rope"].inv_freq, expected)
    llama4 = SCHEMES["llama4_inope"].config_class()
    assert (list(llama4.pattern), llama4.rope.base) == (["rope", "rope", "rope", "none"], 500000.0)
    assert list(SCHEMES["rnope"].config_class().pattern) == ["rope", "rope", "rope", "none"]
    cfg = compose_config(["pe=llama4_inope", "pe.rope.base=1e6", "model.n_layer=4"])
    validate(cfg)
    assert cfg.pe.rope.base == 1e6 and cfg.pe.name == "llama4_inope"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["pe.pattern=[rope,sinusoidal]"], "sinusoidal adds position vectors to the token embeddings"),
        (["pe.pattern=[rope,learned]"], "learned adds position vectors"),
        (["pe.pattern=[ropee]"], "unknown scheme 'ropee'"),
        (["pe.pattern=[]"], "pe.pattern is empty"),
        (["pe.pattern=[rope,rnope]"], "rnope is itself a pattern"),
        (["pe.rope.bse=1"], "Key 'bse' not in 'RoPEConfig'"),
        (["pe.rope.base=0"], r"pe.rope.base=0.0 is out of its domain"),
        (["pe.sinusoidal.base=3"], "Key 'sinusoidal' not in"),
        (["pe.rope.name=alibi"], "the settings pe.rope.\\* are rope's"),
        (["pe.pattern=[alibi,none]", "eval.variations=[yarn:4]"], "no scheme of pe=hybrid's pattern"),
    ],
)
def test_bad_patterns_are_refused_with_one_line(overrides, message):
    with pytest.raises(PosGPTError, match=message) as error:
        validate(compose_config(["pe=hybrid", *overrides]))
    assert "\n" not in str(error.value)


def test_a_pattern_with_a_scheme_that_would_never_run_is_refused():
    """`pe=hybrid pe.pattern=[rope,rope,rope,none]` on the 2-layer default would be plain RoPE under another
    name: refused, naming the layers it needs; on 4 layers it runs whole."""
    cfg = compose_config(["pe=hybrid", "pe.pattern=[rope,rope,rope,none]"])
    with pytest.raises(PosGPTError, match=r"\[rope,rope\]: none would never run; use model.n_layer >= 4"):
        validate(cfg)
    cfg = compose_config(["pe=hybrid", "pe.pattern=[rope,rope,rope,none]", "model.n_layer=4"])
    model = GPT(OmegaConf.to_object(cfg.model), OmegaConf.to_object(cfg.pe), cfg.train.seq_len)
    assert layer_schemes(model) == "[rope,rope,rope,none]"


@pytest.mark.parametrize(
    "pattern", [["rope", "rope", "rope", "none"], ["xpos", "alibi", "cope", "t5"], ["p_rope", "fire", "kerple", "none"]]
)
@torch.inference_mode()
def test_cached_decoding_equals_a_full_forward(pattern):
    model = hybrid(pattern)
    idx = torch.randint(0, VOCAB, (1, 20))
    cache = KVCache()
    cached = [model(idx[:, :5], cache=cache)[:, -1]]
    cached += [model(idx[:, t : t + 1], cache=cache)[:, -1] for t in range(5, idx.shape[1])]
    for t, logits in enumerate(cached, start=4):
        torch.testing.assert_close(logits, model(idx[:, : t + 1])[:, -1], rtol=1e-4, atol=1e-4, msg=f"t={t}")


@torch.inference_mode()
def test_cached_decoding_with_a_length_dependent_rotation_in_some_layers():
    """Dynamic NTK in the RoPE layers keeps their keys unrotated in the cache; within the training length that is
    the plain forward (the NoPE layers cache as usual)."""
    rope = SCHEMES["rope"].config_class(scaling=RoPEScalingConfig(type="dynamic_ntk", factor=2.0))
    model = hybrid(["rope", "none"], n_layer=2, rope=rope)
    assert model.pe.parts["rope"].rotation_depends_on_length()
    idx = torch.randint(0, VOCAB, (1, 12))
    cache = KVCache()
    model(idx[:, :4], cache=cache)
    logits = [model(idx[:, t : t + 1], cache=cache)[:, -1] for t in range(4, 12)]
    torch.testing.assert_close(logits[-1], model(idx)[:, -1], rtol=1e-4, atol=1e-4)


def test_randomized_positions_apply_where_a_layer_uses_them():
    model = hybrid(["rope", "none"], n_layer=2)
    model.pe.check_random_positions(128)
    positions = torch.sort(torch.randperm(128)[:16]).values
    model(torch.randint(0, VOCAB, (2, 16)), positions=positions)
    with pytest.raises(PosGPTError, match="no scheme of pe.pattern=\\[none,cope\\] uses token positions"):
        hybrid(["none", "cope"], n_layer=2).pe.check_random_positions(128)


def test_evaluation_time_variations_apply_to_the_layers_that_have_them():
    model = hybrid(["rope", "rope", "rope", "none"], scheme="rnope")
    pe = model.pe
    assert "rope.scaling" in type(pe).eval_time_settings
    ((label, settings),) = pe.eval_variations(["yarn:4"])
    assert label == "yarn:4" and list(settings) == ["rope.scaling"]
    assert type(pe).variation_label({"rope.scaling": {"type": "yarn", "factor": 4.0}}) == "yarn:4"  # plain values
    idx = torch.randint(0, VOCAB, (1, 16))
    with torch.no_grad():
        before = model(idx)
        with pe.evaluated_with(settings):
            assert pe.current_variation() == "yarn:4" and pe.parts["rope"].cfg.scaling.type == "yarn"
            scaled = model(idx)
        assert pe.current_variation() == "" and torch.equal(model(idx), before)
    assert not torch.equal(scaled, before)
    with pytest.raises(PosGPTError, match="no scheme of pe=rnope's pattern"):
        pe.eval_variations(["nope:2"])


def test_a_child_run_inherits_its_rope_layers_training_length():
    cfg = SCHEMES["rnope"].config_class()
    child = OmegaConf.to_object(
        OmegaConf.merge(OmegaConf.structured(cfg), {"rope": {"scaling": {"type": "yarn", "factor": 2.0}}})
    )
    inherited = SCHEMES["rnope"].inherit(child, cfg, 16)
    assert inherited.rope.scaling.original_seq_len == 16 and inherited.pattern == cfg.pattern


# --- Through the CLI (in-process): a tiny 4-layer RNoPE run, evaluated with YaRN in its RoPE layers, and a child ---

TINY_4 = ["pe=rnope", "model.n_layer=4", "train.max_steps=3"]
EVAL = ["eval.max_tokens=64", "eval.length_multipliers=[1,2]", "eval.protocols=[nonoverlapping]"]


@pytest.fixture(scope="module")
def rnope_run(cli):
    run_dir = cli.base / "hybrid-rnope"
    done = cli.train_here(run_dir, *TINY_4, "train.eval_after=true", *EVAL)
    assert done.returncode == 0, done.stderr
    return run_dir, done


@pytest.mark.slow
def test_a_tiny_run_trains_records_its_layers_and_evaluates(cli, rnope_run):
    run_dir, done = rnope_run
    assert "train: pe=rnope[rope,rope,rope,none] " in done.stdout
    checkpoint = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    recorded = checkpoint["config"]["pe"]
    assert recorded["pattern"] == ["rope", "rope", "rope", "none"] and recorded["rope"]["base"] == 10000.0
    assert {key.split(".")[2] for key in checkpoint["model"] if key.startswith("pe.")} <= {"rope", "none"}
    evaluated = cli.eval_here(run_dir, "eval.variations=[yarn:2]", *EVAL)
    assert evaluated.returncode == 0, evaluated.stderr
    rows = json.loads((run_dir / "eval" / "extrapolation.json").read_text())["results"]
    assert {row["variation"] for row in rows} == {"", "yarn:2"}
    assert {row["attn_backend"] for row in rows} == {"sdpa"}
    sampled = cli.here("sample.py", f"run_dir={run_dir}", "sample.max_new_tokens=40", "pe.rope.scaling.type=yarn")
    assert sampled.returncode == 0, sampled.stderr  # 40 tokens past a 16-token training length, with a cache
    refused = cli.eval_here(run_dir, "pe.pattern=[rope]")
    assert refused.returncode == 2 and "pe.pattern cannot be changed" in refused.stderr


@pytest.mark.slow
def test_a_child_starts_from_a_hybrid_parent(cli, rnope_run):
    parent_dir, _ = rnope_run
    run_dir = cli.base / "hybrid-rnope-child"
    done = cli.train_here(
        run_dir,
        *TINY_4,
        f"train.init_from={parent_dir}",
        "train.seq_len=32",
        "train.max_steps=1",
        "pe.rope.scaling.type=yarn",
        "pe.rope.scaling.factor=2",
    )
    assert done.returncode == 0, done.stderr
    child = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert child["config"]["pe"]["rope"]["scaling"]["original_seq_len"] == 16  # the parent's length
    other = cli.train_here(
        cli.base / "hybrid-other-child", *TINY_4, f"train.init_from={parent_dir}", "pe.pattern=[rope]"
    )
    assert other.returncode == 2 and "pe.pattern" in other.stderr


@pytest.mark.slow
def test_a_mixed_pattern_compiles_as_one_graph_and_computes_as_eager():
    torch._dynamo.reset()
    model = hybrid(["rope", "alibi", "cope", "xpos"]).train()
    x, y = torch.randint(0, VOCAB, (2, 16)), torch.randint(0, VOCAB, (2, 16))
    model(x, y).backward()
    eager = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    torch.compile(model, backend="aot_eager", fullgraph=True)(x, y).backward()
    for name, grad in eager.items():
        torch.testing.assert_close(dict(model.named_parameters())[name].grad, grad, rtol=1e-5, atol=1e-5, msg=name)
    torch._dynamo.reset()
