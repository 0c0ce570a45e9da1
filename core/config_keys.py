"""Which config keys are which, by their dotted names, and the two helpers that read keys so: what never changes what
the trained weights compute (RUNTIME_SETTINGS), what a resumed run may change (RESUME_SETTINGS), a nested config
flattened to dotted keys, and whether a key lies under one of a list of names. Plain data: the planner
(experiment/settings.py) and the reports (reports/runs.py: what makes two runs different settings) read them alike.
"""

from __future__ import annotations

import functools
from typing import Any

# Where and how fast a run computes, and what it reports: never what the weights compute.
RUNTIME_SETTINGS = (
    "train.device",
    "train.dtype",
    "train.compile",
    "train.num_threads",
    "model.attn_backend",
    "model.fused_ce",
    "model.flex_kernel_options",
    "data.cache_dir",
    "data.num_proc",
    "logging.",
)
# A resumed run may train longer and log, validate, save and evaluate differently; its data and optimizer stay.
RESUME_SETTINGS = (
    *RUNTIME_SETTINGS,
    "eval.",
    "sample.",
    "inspect.",
    "data.eval_split",
    "train.max_steps",
    "train.resume",
    "train.log_every",
    "train.val_every",
    "train.val_batches",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.grad_accum_steps",
    "train.skip_nonfinite",
    "train.distributed",
    "train.eval_after",
)


@functools.cache  # a comparison asks it of every key of every run it loads
def may_change(key: str, allowed: tuple[str, ...]) -> bool:
    """Whether dotted ``key`` (or a whole group such as ``data``) is, or lies under, one of ``allowed``."""
    return any(
        key == name.rstrip(".") or key.startswith(name if name.endswith(".") else name + ".") for name in allowed
    )


def flatten_config(tree: dict, prefix: str = "") -> dict[str, Any]:
    """A nested plain-dict config as {dotted key: value}."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten_config(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
