"""Logits and parameter gradients of every shipped scheme on every attention path it takes on the CPU, saved with
torch.save: ``python tests/support/attention_paths.py SOURCE_TREE OUT.pt``. It reads nothing but the model's public
entry points (GPT, KVCache, the scheme registry), so the same script runs on an older tree, and two trees' results can
be compared bit for bit (tests/model/test_attention.py).

Every scheme of ``configs/pe/`` is built tiny, in float32, from a fixed seed, and run through each backend (sdpa,
math, FlexAttention forward only, CPU having no backward; auto is sdpa on a CPU), with positions given per row,
with packed documents, with a sink logit, with captured probabilities, by KV-cache decoding and under an
evaluation-time variation; a few settings that take other paths (PaTH's forget gate, RoPE's remap, a pattern with a
bias scheme) are added. A combination the model refuses records its message, so refusals are compared too.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

T, VOCAB, TRAIN_LEN = 20, 67, 40


def variants(schemes: dict) -> dict[str, tuple[str, dict]]:
    """label -> (scheme name, settings): every shipped scheme, and settings that route elsewhere."""
    shipped = sorted(path.stem for path in (Path(sys.argv[1]) / "configs" / "pe").glob("*.yaml"))
    chosen = {name: (name, {}) for name in shipped if name in schemes}
    chosen["path_gate"] = ("path", {"forget_gate": True})
    chosen["kerple_power"] = ("kerple", {"kernel": "power"})
    chosen["hybrid_alibi"] = ("hybrid", {"pattern": ["alibi", "rope"]})
    chosen["hybrid_fox"] = ("hybrid", {"pattern": ["none", "fox", "kerple"]})
    from model.pe.rope_remap import parse_remap

    chosen["rope_rerope"] = ("rope", {"remap": parse_remap("rerope:8")})
    return chosen


def build(gpt, schemes, name: str, settings: dict, backend: str, sink: bool = False):
    torch.manual_seed(0)
    cfg = gpt.ModelConfig(
        n_layer=4, n_head=2, n_embd=16, vocab_size=VOCAB, attn_backend=backend, attn_sink=sink, init_std=0.2
    )
    model = gpt.GPT(cfg, schemes[name].config_class(**settings), train_seq_len=TRAIN_LEN)
    if sink:
        with torch.no_grad():
            for block in model.blocks:
                block.attn.sink.normal_()
    return model


def inputs() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    idx = torch.randint(0, VOCAB, (2, T), generator=generator)
    positions = torch.stack([torch.randperm(TRAIN_LEN, generator=generator)[:T].sort().values for _ in range(2)])
    documents = torch.tensor([[0] * 7 + [1] * 13, [0] * 12 + [1] * 5 + [2] * 3])
    return {"idx": idx, "positions": positions, "documents": documents}


def run_case(model, data: dict, case: str, train: bool) -> dict[str, torch.Tensor]:
    """The logits of one case (and with ``train``, the gradients of every parameter of a loss of them)."""
    idx, kwargs, probs = data["idx"], {}, []
    if case == "positions":
        kwargs["positions"] = data["positions"]
    elif case == "documents":
        kwargs["documents"] = data["documents"]
    elif case == "capture":
        kwargs["capture"] = probs
    if case == "variation":  # an evaluation-time variation applied to the built model
        (_, settings), *_ = model.pe.eval_variations(["rerope:8"])
        with model.pe.evaluated_with(settings), torch.no_grad():
            return {"logits": model(idx)}
    if case == "cache":
        cache = model_module.KVCache()
        steps = [model(idx[:, :12], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(12, T)]
        return {"logits": torch.cat(steps, dim=1)}
    with torch.set_grad_enabled(train):
        logits = model(idx, **kwargs)
    out = {"logits": logits.detach()}
    if probs:
        out["probs"] = torch.stack(probs)
    if train:
        (logits.float().square().mean() + logits.float().mean()).backward()
        for parameter_name, parameter in model.named_parameters():
            out[f"grad.{parameter_name}"] = parameter.grad
    return out


CASES = [
    # (backend, case, sink, train); FlexAttention's forward once (plain): its eager compilation on the CPU costs most of
    # the comparison's time, and its per-row positions and documents are checked against the math path elsewhere
    ("sdpa", "plain", False, True),
    ("math", "plain", False, True),
    ("flex", "plain", False, False),
    ("sdpa", "positions", False, True),
    ("math", "positions", False, True),
    ("sdpa", "documents", False, True),
    ("math", "documents", False, False),
    ("sdpa", "plain", True, True),
    ("math", "plain", True, True),
    ("sdpa", "capture", False, False),
    ("sdpa", "cache", False, False),
    ("math", "cache", False, False),
    ("sdpa", "variation", False, False),
]


def main() -> None:
    global model_module
    sys.path.insert(0, sys.argv[1])
    import warnings

    warnings.filterwarnings("ignore")
    import model as model_module
    from model.pe import SCHEMES

    torch.use_deterministic_algorithms(True)
    data, results = inputs(), {}
    for label, (name, settings) in variants(SCHEMES).items():
        for backend, case, sink, train in CASES:
            key = f"{label}/{backend}/{case}" + ("/sink" if sink else "")
            try:
                model = build(model_module, SCHEMES, name, settings, backend, sink)
                model.train(train)
                results[key] = run_case(model, data, case, train)
            except Exception as error:  # a refusal is a result too
                results[key] = {"error": f"{type(error).__name__}: {error}"}
    torch.save(results, sys.argv[2])


model_module = None

if __name__ == "__main__":
    main()
