"""The attention backends' cases (tests/model/test_kernels_backends.py and the FlexAttention and math-path tests):
a scheme built tiny, seeded q, k and v, attention through a backend, its output and gradients, and their comparison."""

import torch

from model.kernels import attend
from model.pe import SCHEMES, ModelDims, PositionState, build_positional_encoding

B, H, T, D = 2, 4, 40, 16


def scheme(name, device="cpu"):
    dims = ModelDims(n_embd=H * D, n_head=H, head_dim=D, train_seq_len=T, init_std=0.02, n_layer=2)
    torch.manual_seed(0)
    pe = build_positional_encoding(SCHEMES[name].config_class(), dims).to(device)
    with torch.no_grad():  # zero-initialised tables (CoPE) would hide a wrong gradient path
        for p in pe.parameters():
            if not p.any():
                p.normal_(0.0, 0.5)
    return pe


def qkv(tq=T, tk=T, device="cpu", dtype=torch.float32, requires_grad=True, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(B, H, tq, D), (B, H, tk, D), (B, H, tk, D)]
    return [torch.randn(s, generator=generator).to(device, dtype).requires_grad_(requires_grad) for s in shapes]


def attend_at(backend, pe, q, k, v, layer=0, positions=None):
    state = None
    if positions is not None:
        state = PositionState(positions, positions, 0, pe.prepare(positions, positions.shape[-1], {}), explicit=True)
    return attend(q, k, v, pe, backend, state=state, layer=layer)


def output_and_grads(backend, pe, q, k, v, layer=0, positions=None):
    """The output and the gradients of q, k, v and of every parameter of the scheme (per-row positions: a
    (B, T) tensor, or None for 0..T-1)."""
    tensors = [q, k, v, *pe.parameters()]
    for t in tensors:
        t.grad = None
    out = attend_at(backend, pe, q, k, v, layer, positions)
    out.square().sum().backward()
    # A parameter of another layer gets no gradient at all: count it as zero.
    return [out.detach()] + [t.grad.clone() if t.grad is not None else torch.zeros_like(t) for t in tensors]


def assert_relatively_close(got, want, bound):
    """Each tensor within ``bound`` of the reference's norm: a kernel that multiplies in TF32 or bfloat16 blocks moves
    small entries by more than their own size, where a wrong term (a scale, a gate) moves the whole tensor by tens of
    percent."""
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape and ((g.float() - w.float()).norm() / w.float().norm()).item() < bound, i


def assert_all_close(got, want, **tolerances):
    assert len(got) == len(want)
    names = ["output", "grad q", "grad k", "grad v"] + [f"grad of scheme parameter {i}" for i in range(len(got) - 4)]
    for g, w, name in zip(got, want, names):
        torch.testing.assert_close(g.float(), w.float(), msg=lambda m, name=name: f"{name}: {m}", **tolerances)
