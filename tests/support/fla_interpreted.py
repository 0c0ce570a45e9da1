"""flash-linear-attention's Triton kernels of stick-breaking and PaTH attention, run on the CPU by Triton's
interpreter (``TRITON_INTERPRET=1``, set by the caller before anything imports Triton), through posgpt's own wrappers
(model/pe/base.py, hook 8), against the written-out path: a tiny model's per-token losses and every gradient. Run as
a script by tests/model/test_kernels_fused_attention.py; prints one JSON line per variant.

The interpreter runs a kernel's programs one by one in NumPy, so it cannot time the autotuner's candidate
configurations: each autotuned kernel runs its first one (any of them computes the same numbers)."""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from model import GPT, ModelConfig  # noqa: E402
from model.pe import SCHEMES  # noqa: E402
from model.pe.capabilities import installed_kernel  # noqa: E402

VARIANTS = [
    ("stickbreaking", {}),
    ("stickbreaking", {"attend_current": True}),
    ("path", {}),
    ("path", {"forget_gate": True}),
]


def tiny(name: str, backend: str, settings: dict) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=101, attn_backend=backend)
    model = GPT(cfg, SCHEMES[name].config_class(**settings), train_seq_len=64)
    if name == "path":
        with torch.no_grad():  # beta away from 1 and the gate away from 1/2, so that a wrong transition shows
            for p in (model.pe.beta_bias, *([model.pe.gate_bias] if settings.get("forget_gate") else [])):
                p.normal_(0.0, 1.0)
    return model


def losses_and_gradients(model: GPT, idx: torch.Tensor) -> list[torch.Tensor]:
    loss = model(idx[:, :-1], idx[:, 1:], reduction="none")
    loss.sum().backward()
    return [loss.detach()] + [p.grad for p in model.parameters() if p.grad is not None]


def compare(name: str, settings: dict, idx: torch.Tensor) -> dict:
    """The variant through its kernel (the scheme's wrapper, made as on CUDA, then run on CPU tensors) and through the
    written-out path: how many layers ran the kernel, and the largest difference relative to a tensor's size."""
    fused, written_out = tiny(name, "auto", settings), tiny(name, "math", settings)
    fused.pe._kernel = installed_kernel(*fused.pe.fused_kernel)  # built without CUDA: not imported
    wrapper = type(fused.pe).fused_attention(fused.pe, torch.device("cuda"))  # the device only gates CUDA
    calls = []

    def counted(q, k, v, call):
        calls.append(call.layer)
        return wrapper(q, k, v, call)

    fused.pe.fused_attention = lambda device: counted  # this instance, on the CPU
    # in float32, which the interpreter runs without a GPU's shared-memory limit (PaTH's kernel takes bf16 on a GPU):
    # the kernel's arithmetic against the written-out path's
    fused.pe.fused_dtypes = frozenset({torch.float32})
    fused.resolve_attention_paths()  # resolved when it was built, without the kernel
    got, want = losses_and_gradients(fused, idx), losses_and_gradients(written_out, idx)
    worst = max(((a - b).norm() / b.norm()).item() for a, b in zip(got, want, strict=True))
    return {"scheme": name, "settings": settings, "layers": calls, "tensors": len(got), "worst": worst}


def main() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("error: set TRITON_INTERPRET=1 before running this (Triton reads it when it defines its kernels)")
    import triton.runtime.autotuner as autotuner

    prune = autotuner.Autotuner.prune_configs
    autotuner.Autotuner.prune_configs = lambda self, kwargs: prune(self, kwargs)[:1]
    # Some Triton versions (3.7) time even a single remaining candidate, through the GPU driver the interpreter lacks:
    # the timing is not needed to pick the only one.
    autotuner.Autotuner._bench = lambda self, *args, config, **kwargs: [0.0, 0.0, 0.0]
    warnings.filterwarnings("ignore")  # fla's "Triton is not supported on current platform, roll back to CPU"
    idx = torch.randint(0, 101, (1, 71), generator=torch.Generator().manual_seed(1))  # 70: not whole 64-token blocks
    for name, settings in VARIANTS:
        print(json.dumps(compare(name, settings, idx)), flush=True)


if __name__ == "__main__":
    main()
