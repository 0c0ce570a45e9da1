"""Multi-process training under ``torchrun``: DDP by default, FSDP2 (``fully_shard``) when asked.

Every rank draws the same global batch from the same seeded generator and takes its own slice of it, so
N processes see exactly the data one process would, and their averaged gradients are the same.
Only rank 0 logs, writes metrics and checkpoints.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device_name: str) -> DistInfo:
    """Join the process group when launched by torchrun (RANK/WORLD_SIZE set); a no-op otherwise."""
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"]))
    use_cuda = torch.cuda.is_available() and device_name in ("auto", "cuda")
    if use_cuda:
        torch.cuda.set_device(info.local_rank)
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return info


def device_for(info: DistInfo, device: torch.device) -> torch.device:
    """Under torchrun each rank owns GPU ``local_rank``."""
    if info.enabled and device.type == "cuda":
        return torch.device("cuda", info.local_rank)
    return device


def wrap_model(model: nn.Module, info: DistInfo, strategy: str, device: torch.device) -> nn.Module:
    if not info.enabled:
        return model
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        return fully_shard(model)
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def no_grad_sync(model: nn.Module, sync: bool):
    """Skip the gradient all-reduce on accumulation micro-steps; only the last one communicates."""
    if sync:
        return contextlib.nullcontext()
    if hasattr(model, "no_sync"):  # DDP
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2

        @contextlib.contextmanager
        def fsdp_no_sync():
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)

        return fsdp_no_sync()
    return contextlib.nullcontext()


def all_reduce_mean(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= info.world_size
    return value


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


def full_state_dicts(model: nn.Module, optimizer: torch.optim.Optimizer, info: DistInfo) -> tuple[dict, dict]:
    """Unsharded model and optimizer state on CPU (collective under torchrun: every rank must call)."""
    if not info.enabled:
        return model.state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    return get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state_dicts(model: nn.Module, optimizer: torch.optim.Optimizer, model_state: dict,
                          optim_state: dict, info: DistInfo) -> None:
    if not info.enabled:
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optim_state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state,
                   options=StateDictOptions(full_state_dict=True))
