"""Multi-process training: DDP by default, FSDP2 (``fully_shard``) with ``train.distributed=fsdp``.

Two ways to start the processes, one per GPU, on one or many nodes:
- ``torchrun`` sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT;
- a submitit job (``hydra/launcher=slurm`` or ``submitit_local``) with several tasks: each task is a rank,
  and SLURM's (or submitit's) variables are turned into torchrun's here.

Every rank draws the same global batch from the same seeded generator and keeps its own rows, so N
processes see exactly the data one process would, and their averaged gradients are the same. Only rank 0
logs, writes metrics and checkpoints. Checkpoints always hold full (unsharded) state dicts keyed by
parameter name, so a run can be resumed with another number of processes or another strategy.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from core.errors import PosGPTError


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


def _export_submitit_ranks() -> None:
    """In a submitit job with several tasks, set the variables torchrun would have set (from SLURM's)."""
    if "RANK" in os.environ or os.environ.get("SUBMITIT_EXECUTOR") not in ("slurm", "local"):
        return
    from submitit.helpers import TorchDistributedEnvironment

    env = TorchDistributedEnvironment()
    if env.world_size > 1:
        # Each task sees all of the node's GPUs and picks cuda:LOCAL_RANK, as under torchrun.
        env.export(set_cuda_visible_devices=False)


def init_distributed(device_name: str) -> DistInfo:
    """Join the process group when started as one of several ranks; a no-op for a single process."""
    _export_submitit_ranks()
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0")), int(os.environ["WORLD_SIZE"]))
    use_cuda = torch.cuda.is_available() and device_name != "cpu"
    if use_cuda:
        torch.cuda.set_device(info.local_rank)
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return info


def wrap_model(model: nn.Module, info: DistInfo, strategy: str, device: torch.device) -> nn.Module:
    """DDP (a full replica per rank) or FSDP2 (each block's parameters sharded over the ranks).

    FSDP2 replaces the parameters in place, so the optimizer must be built after this call.
    """
    if not info.enabled:
        return model
    if strategy == "fsdp":
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:  # torch < 2.6 has FSDP2 only under a private name
            raise PosGPTError(
                f"train.distributed=fsdp needs torch >= 2.6 (this is {torch.__version__}); use train.distributed=ddp"
            ) from None

        for block in model.blocks:
            fully_shard(block)
        return fully_shard(model)
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


@contextlib.contextmanager
def _fsdp_no_sync(model: nn.Module) -> Iterator[None]:
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def no_grad_sync(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Skip the gradient all-reduce on accumulation micro-steps; only the last one communicates."""
    if sync:
        return contextlib.nullcontext()
    if hasattr(model, "no_sync"):  # DDP
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        return _fsdp_no_sync(model)
    return contextlib.nullcontext()


def all_reduce_mean(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= info.world_size
    return value


def any_rank(flag: bool, info: DistInfo, device: torch.device) -> bool:
    """True on every rank if ``flag`` is true on any rank (collective under torchrun: every rank must call)."""
    return bool(max_over_ranks(int(flag), info, device))


def max_over_ranks(value: int, info: DistInfo, device: torch.device) -> int:
    """The largest of every rank's ``value`` (a small integer), on every rank (collective, as any_rank)."""
    if not info.enabled:
        return value
    tensor = torch.tensor([float(value)], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: the local shard of an FSDP2 DTensor, the tensor itself otherwise."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def broadcast_object(value, info: DistInfo):
    """Rank 0's ``value`` on every rank."""
    if not info.enabled:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


def full_state_dicts(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Unsharded model and optimizer state on CPU, keyed by parameter name (rank 0 gets them; under torchrun
    every rank must call). The same format for one process, DDP and FSDP2."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict  # slow to import

    return get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state_dicts(
    model: nn.Module, optimizer: torch.optim.Optimizer, model_state: dict, optim_state: dict
) -> None:
    """Load what ``full_state_dicts`` returned (every rank passes the full dicts; FSDP2 keeps its shard)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    set_state_dict(
        model,
        optimizer,
        model_state_dict=model_state,
        optim_state_dict=optim_state,
        options=StateDictOptions(full_state_dict=True),
    )
