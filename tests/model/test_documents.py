"""Document-aware training windows (data.document_aware): positions restart after each <|endoftext|> and attention
stays within each document, for every scheme and attention path; the targets; the default unchanged; the
refusals; and one training run through train.py."""

import json
import warnings

import pytest
import torch
import torch.nn.functional as F
from cli_runs import REPO, TINY, assert_one_line_error, train_losses
from omegaconf import OmegaConf
from tiny_checkpoint import make_run

from core.checkpoint_io import load_checkpoint
from core.errors import PosGPTError
from data import EOT_TOKEN, separate_documents
from experiment.compose import compose_config
from experiment.plan import check_training_config
from experiment.settings import trained_config
from model import GPT, KVCache, ModelConfig
from model.documents import within_document_index
from model.pe import SCHEMES
from model.temperature import TemperatureConfig
from reports.runs import Run, run_config, setting

T = 24
FIRST = 9  # the first document's tokens, its <|endoftext|> the last of them
# flex: FlexAttention's forward, which CPU runs eagerly and slowly (a score_mod over every pair): the slow tier
BACKENDS = ("math", "sdpa", pytest.param("flex", marks=pytest.mark.slow))
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}  # float32, other shapes and kernels than the document alone


def tiny(name: str, backend: str = "math", pe_cfg=None, **model_settings) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=4, n_head=2, n_embd=32, attn_backend=backend, **model_settings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex on CPU: "called without torch.compile"
        return GPT(cfg, pe_cfg or SCHEMES[name].config_class(), train_seq_len=T).eval()


def packed_rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two rows: [document a + EOT, document b] and [c] (one document); and b alone."""
    generator = torch.Generator().manual_seed(0)
    a, b, c = (torch.randint(0, 1000, (n,), generator=generator) for n in (FIRST - 1, T - FIRST, T))
    row = torch.cat((a, torch.tensor([EOT_TOKEN]), b))
    return torch.stack((row, c)), b, a


def test_documents_and_targets_of_a_window():
    x = torch.tensor([[5, EOT_TOKEN, 7, 8, EOT_TOKEN], [EOT_TOKEN, 1, 2, 3, 4]])
    y = torch.tensor([[EOT_TOKEN, 7, 8, EOT_TOKEN, 9], [1, 2, 3, 4, 5]])
    documents, targets = separate_documents(x, y)
    # the <|endoftext|> belongs to the document it ends; the token after it starts the next one
    assert documents.tolist() == [[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]]
    # only an <|endoftext|>'s target (the next document's first token) is left out
    assert targets.tolist() == [[EOT_TOKEN, -100, 8, EOT_TOKEN, -100], [-100, 2, 3, 4, 5]]
    assert within_document_index(documents).tolist() == [[0, 1, 0, 1, 2], [0, 0, 1, 2, 3]]


def test_positions_restart_after_each_end_of_text():
    x, _, _ = packed_rows()
    documents, _ = separate_documents(x, x)
    state = tiny("rope")._position_state(x, None, None, documents)
    assert state.positions[0].tolist() == list(range(FIRST)) + list(range(T - FIRST))
    assert state.positions[1].tolist() == list(range(T))
    assert state.explicit and torch.equal(state.documents, documents)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_each_document_is_computed_as_if_alone(name, backend):
    """The second document of a packed row gives the logits it gives alone at positions 0.. (the first, those of the
    row's first FIRST tokens alone); a row of one document, those of no documents at all."""
    model = tiny(name, backend)
    x, b, a = packed_rows()
    documents, _ = separate_documents(x, x)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        packed = model(x, documents=documents)
        torch.testing.assert_close(packed[0, FIRST:], model(b[None])[0], **TOLERANCE)
        torch.testing.assert_close(packed[0, :FIRST], model(x[:1, :FIRST])[0], **TOLERANCE)
        torch.testing.assert_close(packed[1], model(x[1:])[0], **TOLERANCE)
        # without documents the second document sees the first: other logits
        assert not torch.allclose(model(x)[0, FIRST:], packed[0, FIRST:], atol=1e-4)


def with_remap(kind: str):
    pe_cfg = SCHEMES["rope"].config_class()
    pe_cfg.remap.type, pe_cfg.remap.window = kind, 4
    if kind == "self_extend":
        pe_cfg.remap.group = 2
    return pe_cfg


VARIANTS = {  # the settings whose attention paths differ from a plain scheme's
    "rope sink": ("rope", None, {"attn_sink": True}),
    "fox sink": ("fox", None, {"attn_sink": True}),
    "alibi ssmax": ("alibi", None, {"attn_temperature": TemperatureConfig(type="ssmax")}),
    "rope llama4": ("rope", None, {"attn_temperature": TemperatureConfig(type="llama4", floor_scale=4)}),
    "rope self_extend": ("rope", with_remap("self_extend"), {}),
    "rope rerope": ("rope", with_remap("rerope"), {}),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_sinks_temperatures_and_remaps_keep_documents_apart(variant, backend):
    """A sink, a temperature (its n: the keys of the query's own document) and the windowed attention of RoPE's
    remaps: each document as if alone, too."""
    name, pe_cfg, settings = VARIANTS[variant]
    model = tiny(name, backend, pe_cfg, **settings)
    x, b, _ = packed_rows()
    documents, _ = separate_documents(x, x)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(model(x, documents=documents)[0, FIRST:], model(b[None])[0], **TOLERANCE)


# weights not from a softmax, where the scheme exists: they need not sum to 1
NOT_SOFTMAX = [name for name in ("stickbreaking",) if name in SCHEMES]


@pytest.mark.parametrize("variant", ["rope", "cope", "rope self_extend", *NOT_SOFTMAX])
def test_no_attention_crosses_a_boundary(variant):
    """The probabilities (the capture path: the written-out attention, or the windowed one) are exactly 0 from the
    second document to the first, and a softmax's still sum to 1 (stick-breaking's weights need not)."""
    name, pe_cfg, settings = VARIANTS.get(variant, (variant, None, {}))
    x, _, _ = packed_rows()
    documents, _ = separate_documents(x, x)
    model, probs = tiny(name, "math", pe_cfg, **settings), []
    with torch.no_grad():
        model(x, documents=documents, capture=probs)
    assert len(probs) == 4
    for layer in probs:
        assert torch.all(layer[0, :, FIRST:, :FIRST] == 0)
        assert torch.all(layer.triu(diagonal=1) == 0)  # causal still
        assert torch.any(layer[0, :, : FIRST - 1, : FIRST - 1] > 0)  # and the documents attend within
        if variant not in NOT_SOFTMAX:
            torch.testing.assert_close(layer.sum(-1), torch.ones_like(layer.sum(-1)))


@pytest.mark.parametrize("name", ["rope", "alibi", "fox", "fire", "cope"])
def test_training_paths_agree_forward_and_backward(name):
    """With documents, sdpa's blockwise mask (the CPU training path) gives math's loss and gradients; a sink too."""
    x, _, _ = packed_rows()
    documents, y = separate_documents(x, x.roll(-1, dims=1))
    results = []
    for backend in ("math", "sdpa"):
        model = tiny(name, backend, attn_sink=True).train()
        loss = model(x, y, documents=documents)
        loss.backward()
        results.append((loss, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (loss_math, grads_math), (loss_sdpa, grads_sdpa) = results
    torch.testing.assert_close(loss_sdpa, loss_math)
    for n in grads_math:
        torch.testing.assert_close(grads_sdpa[n], grads_math[n], rtol=1e-4, atol=1e-6, msg=n)


def test_the_loss_covers_every_target_but_each_end_of_texts():
    model = tiny("rope", "sdpa")
    x, _, _ = packed_rows()
    documents, y = separate_documents(x, x.roll(-1, dims=1))
    with torch.no_grad():
        logits = model(x, documents=documents)
        kept = x != EOT_TOKEN
        expected = F.cross_entropy(logits[kept], x.roll(-1, dims=1)[kept])
        torch.testing.assert_close(model(x, y, documents=documents), expected, **TOLERANCE)
    assert int((y == -100).sum()) == 1  # the one boundary of the batch


def test_without_documents_nothing_changes():
    """documents=None is the model as before, bit for bit (every other test of the model runs that path)."""
    model = tiny("alibi", "sdpa")
    x, _, _ = packed_rows()
    with torch.no_grad():
        assert torch.equal(model(x, documents=None), model(x))
        assert torch.equal(model(x, x, documents=None), model(x, x))


def test_documents_take_given_positions_and_refuse_a_cache():
    """Training gives the positions it derives (an input of a compiled model): the same logits as derived here."""
    model = tiny("alibi", "sdpa")
    x, _, _ = packed_rows()
    documents, _ = separate_documents(x, x)
    with torch.no_grad():
        derived = model(x, documents=documents)
        assert torch.equal(model(x, documents=documents, positions=within_document_index(documents)), derived)
    with pytest.raises(PosGPTError, match="KV cache"):
        model(x, documents=documents, cache=KVCache())
    with pytest.raises(PosGPTError, match="shape of the tokens"):
        model(x, documents=documents[:, 1:])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["task=passkey"], r"data.document_aware=true is read only by a language-model run; .* \(task=passkey\)"),
        (["train.random_positions=256"], "train.random_positions draws one set per window"),
        (["data=wikitext103"], "data.rows_are_documents=false joins the rows of wikitext103"),
    ],
)
def test_where_windows_hold_no_documents_to_keep_apart_it_is_refused(overrides, message):
    cfg = compose_config(["data.document_aware=true", *overrides])
    with pytest.raises(PosGPTError, match=message):
        check_training_config(cfg)
    check_training_config(compose_config(overrides))  # fine without it


def test_an_evaluation_refuses_it_and_scores_the_stream(cli, tmp_path):
    """An evaluation scores windows of the stream whatever the run trained with: setting the key there is refused;
    a run trained with it is evaluated as any other."""
    run_dir = make_run(tmp_path / "run", cli.corpus, "data.document_aware=true")
    refused = cli.eval_here(run_dir, "data.document_aware=false")
    assert_one_line_error(refused, "eval.py does not read data.document_aware (read by train.py)")
    done = cli.eval_here(run_dir, "eval.lengths=[16]", "eval.protocols=[nonoverlapping]")
    assert done.returncode == 0, done.stderr


def many_documents(path):
    """A .jsonl corpus of short documents, so that 16-token windows cross boundaries."""
    text = (REPO / "data" / "windows.py").read_text().split()
    rows = [{"text": " ".join(text[i : i + 12])} for i in range(0, len(text) - 12, 6)]
    path.write_text("\n".join(json.dumps(row) for row in rows))
    return path


@pytest.mark.slow
def test_a_compiled_model_keeps_documents_apart():
    """torch.compile with the positions training gives: FlexAttention's document block mask built inside the graph,
    and the blockwise sdpa training path with its backward, equal the eager model. Traced by dynamo and AOTAutograd
    (aot_eager), the device-independent part of torch.compile: inductor's CPU code generation for FlexAttention is
    not what a GPU runs (Triton), and costs most of a minute here (tests/training/test_step.py compiles a bias
    scheme with inductor)."""
    x, _, _ = packed_rows()
    documents, y = separate_documents(x, x.roll(-1, dims=1))
    positions = within_document_index(documents)
    torch._dynamo.reset()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tiny("alibi", "flex")
        compiled = torch.compile(model, backend="aot_eager")(x, documents=documents, positions=positions)
        torch.testing.assert_close(compiled, model(x, documents=documents), **TOLERANCE)
    model = tiny("rope", "sdpa").train()
    loss = torch.compile(model, backend="aot_eager")(x, y, documents=documents, positions=positions)
    loss.backward()
    torch.testing.assert_close(loss, model(x, y, documents=documents), **TOLERANCE)


def test_train_py_with_documents_apart(cli, tmp_path):
    """A tiny run through train.py: it trains, records the setting in its checkpoint's config, and so is another
    setting than the same run without it (reports/runs.py groups seeds by setting)."""
    corpus = many_documents(tmp_path / "docs.jsonl")
    argv = [*TINY, f"data.files=[{corpus}]", "data.val_fraction=0.2", "train.max_steps=3", "train.grad_accum_steps=2"]
    runs = {}
    for aware in ("true", "false"):
        run_dir = tmp_path / f"aware-{aware}"
        done = cli.here("train.py", *argv, f"hydra.run.dir={run_dir}", f"data.document_aware={aware}")
        assert done.returncode == 0, done.stderr
        assert sorted(train_losses(run_dir)) == [1, 2, 3]
        config, latest = run_config(run_dir, {"step": 3}, trained_config)
        assert latest == 3
        assert config["data"]["document_aware"] is (aware == "true")
        runs[aware] = Run(run_dir, {"pe": "learned", "step": 3}, config)
    # the same windows (the same seed), seen apart: another first loss
    assert train_losses(tmp_path / "aware-true")[1] != train_losses(tmp_path / "aware-false")[1]
    assert setting(runs["true"]) != setting(runs["false"])
    saved = OmegaConf.create(load_checkpoint(tmp_path / "aware-true")["config"])
    assert saved.data.document_aware is True
