"""A compiled training step against eager (tests/training/test_step.py, and the schemes with a kernel of their own):
three steps of a tiny model, compiled and eager, with the same losses and parameters."""

import torch
from omegaconf import OmegaConf

from experiment.config import TrainConfig
from experiment.plan import section_settings
from model import GPT, ModelConfig
from model.pe import SCHEMES
from training.optim import OptimizerSettings, build_optimizer, build_scheduler
from training.step import TrainStep

SEQ_LEN, VOCAB = 16, 64
CPU = torch.device("cpu")


def tiny(name: str) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=VOCAB, fused_ce="never")
    return GPT(cfg, SCHEMES[name].config_class(), train_seq_len=SEQ_LEN)


def batches(n: int = 3, length: int = SEQ_LEN) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    tokens = [torch.randint(0, VOCAB, (2, length + 1), generator=generator) for _ in range(n)]
    return [(t[:, :-1], t[:, 1:]) for t in tokens]


def train_step(model: torch.nn.Module, params: torch.nn.Module, eager: torch.nn.Module | None = None) -> TrainStep:
    cfg = OmegaConf.structured(TrainConfig(lr=1e-2, warmup_steps=1, max_steps=10))
    settings = section_settings(OptimizerSettings, cfg)
    optimizer = build_optimizer(params, settings, CPU)
    return TrainStep(
        model, optimizer, build_scheduler(optimizer, settings), 1, cfg.grad_clip, CPU, torch.float32, eager
    )


def three_steps(name: str, backend: str | None) -> tuple[dict, torch.Tensor, dict]:
    """Gradients of the first batch, the losses of 3 training steps, and the parameters after them."""
    model = tiny(name)
    run = torch.compile(model, backend=backend, fullgraph=True) if backend else model
    x, y = batches(1)[0]
    run(x, y).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    step = train_step(run, model)
    losses = torch.stack([step(x, y)[0] for x, y in batches()])
    return grads, losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def assert_same_training(name: str, backend: str) -> None:
    (got_grads, got_losses, got_params), (grads, losses, params) = three_steps(name, backend), three_steps(name, None)
    assert got_grads.keys() == grads.keys()
    # Adam divides each gradient by its own running size, so an entry whose gradient is zero in exact arithmetic (the
    # key bias where softmax ignores a shift of one query's scores) moves by lr x rounding noise, which differs between
    # compilers, torch versions and CPUs: such entries' gradients are compared, their parameters after the steps not.
    moving = {n: grads[n].abs() > 1e-6 if n in grads else torch.ones_like(p, dtype=bool) for n, p in params.items()}
    got_params = {n: p[moving[n]] for n, p in got_params.items()}
    params = {n: p[moving[n]] for n, p in params.items()}
    for kind, got, want in (("gradient", got_grads, grads), ("parameter after 3 steps", got_params, params)):
        for n in want:
            message = f"{kind} {n}"
            torch.testing.assert_close(got[n], want[n], rtol=1e-5, atol=1e-5, msg=lambda m, s=message: f"{s}: {m}")
    torch.testing.assert_close(got_losses, losses, rtol=1e-5, atol=1e-5)
