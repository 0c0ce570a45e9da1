"""Device, precision and throughput accounting shared by training, evaluation and benchmarks.

:func:`set_up_runtime` is the one place a command turns ``train.device/dtype/num_threads/seed`` into a
device, an autocast dtype and torch's global settings; train.py's loop, eval.py and scripts/speed.py call it.
"""

from __future__ import annotations

import contextlib
import random
from typing import Protocol

import numpy as np
import torch

from core.errors import PosGPTError

# Dense bf16 peak FLOP/s per GPU (no sparsity, fp32 accumulation), for MFU. Matched against
# torch.cuda.get_device_name(); the longest key contained in the name wins ("L40S" before "L4").
# GPUs without bf16 tensor cores (V100, T4) have no entry: their MFU is reported as null.
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
    "L40": 181e12,
    "L4": 121e12,
    "A40": 150e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
}


def select_device(name: str) -> torch.device:
    """``train.device`` as a torch device that exists on this machine: auto (a GPU where there is one), cpu, cuda or
    cuda:N; anything else (a typo, another kind of accelerator, a GPU this machine lacks) is one line."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):  # torch's own message lists every device type it knows
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise PosGPTError(f"train.device={name!r}: posgpt runs on auto, cpu, cuda or cuda:N (N a GPU's index)")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise PosGPTError(f"train.device={name} but CUDA is not available; use train.device=auto or cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise PosGPTError(f"train.device={name}: this machine has {count} GPU(s), cuda:0 to cuda:{count - 1}")
    return device


def select_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto: bf16 autocast on GPUs that have bf16 tensor cores, fp32 elsewhere (CPUs, V100, T4)."""
    if name == "auto":
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)
        return torch.bfloat16 if bf16 else torch.float32
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


MAX_SEED = 2**32 - 1  # numpy's seeds are 32-bit: the largest seed every RNG accepts


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class RuntimeSettings(Protocol):
    """What :func:`set_up_runtime` reads: the ``train`` section of a posgpt config."""

    device: str
    dtype: str
    num_threads: int
    seed: int


def set_up_runtime(settings: RuntimeSettings, local_rank: int | None = None) -> tuple[torch.device, torch.dtype]:
    """The device and the autocast dtype (float32: none); sets threads and TF32 and seeds every RNG.

    Under torchrun, ``local_rank`` is this process's GPU on its node."""
    device = select_device(settings.device)
    if device.type == "cuda" and local_rank is not None:
        device = torch.device("cuda", local_rank)
    configure_backends(device, settings.num_threads)
    seed_everything(settings.seed)
    return device, select_dtype(settings.dtype, device)


def compile_enabled(setting: str, device_type: str) -> bool:
    """train.compile: ``true``/``false`` (as typed, or the ``True``/``False`` Hydra makes of them), or ``auto``
    (on for CUDA only)."""
    setting = str(setting).lower()
    return setting == "true" or (setting == "auto" and device_type == "cuda")


def peak_flops(device: torch.device) -> float | None:
    """Peak dense bf16 FLOP/s of this GPU, or None (CPU, unknown GPU): MFU is then reported as null."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    matches = [key for key in PEAK_BF16_FLOPS if key in name]
    return PEAK_BF16_FLOPS[max(matches, key=len)] if matches else None


def flops_per_token(n_params: int, n_layer: int, n_embd: int, seq_len: int) -> float:
    """Training FLOPs per token, PaLM appendix B: 6N + 12 * n_layer * n_embd * seq_len.

    N should count the weights used in matmuls, the (tied) output head included, but not lookup-only
    tables such as a learned position table;
    biases and norms are counted too, as in PaLM and nanoGPT (under 0.1% at GPT-2 size). The second term is
    attention's q.k and attention.v products (forward + backward) over the full T x T square, the usual
    convention even though causal kernels skip half of it. :func:`experiment.build.model_flops_per_token` applies
    it to a posgpt GPT; the training loop and scripts/speed.py both report MFU with that one count.
    """
    return 6 * n_params + 12 * n_layer * n_embd * seq_len
