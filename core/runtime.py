"""Device, precision and throughput accounting shared by training, evaluation and benchmarks."""

from __future__ import annotations

import contextlib
import random

import numpy as np
import torch

from core.errors import PosGPTError

# Dense bf16 peak FLOP/s per GPU (no sparsity), for MFU. Matched against torch.cuda.get_device_name().
PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100 SXM": 989e12,
    "H100 80GB HBM3": 989e12,
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "H100": 989e12,
    "GH200": 989e12,
    "B200": 2250e12,
    "A100": 312e12,
    "A10G": 125e12,
    "L40S": 362e12,
    "L4": 121e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
    "V100": 125e12,
}


def select_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise PosGPTError(f"train.device={name} but CUDA is not available; use train.device=auto or cpu")
    return device


def select_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def autocast(device: torch.device, dtype: torch.dtype):
    """bf16 autocast where asked (matmuls in bf16, reductions in fp32); a no-op for fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def configure_backends(device: torch.device, num_threads: int = 0) -> None:
    if num_threads > 0:
        torch.set_num_threads(num_threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def peak_flops(device: torch.device) -> float | None:
    """Peak dense bf16 FLOP/s of this GPU, or None (CPU, unknown GPU): MFU is then reported as null."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, flops in PEAK_BF16_FLOPS.items():
        if key in name:
            return flops
    return None


def flops_per_token(n_params: int, n_layer: int, n_embd: int, seq_len: int) -> float:
    """Training FLOPs per token, PaLM appendix B: 6N + 12 * n_layer * n_embd * seq_len.

    N counts every weight matmul including the (tied) output head; the second term is attention's
    q.k and attention.v products (forward + backward).
    """
    return 6 * n_params + 12 * n_layer * n_embd * seq_len
