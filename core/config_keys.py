"""Which config keys are which, by their dotted names, and the helpers that read keys so: what never changes what
the trained weights compute (RUNTIME_SETTINGS), what a resumed run may change (RESUME_SETTINGS), a nested config
flattened to dotted keys, whether a key lies under one of a list of names, and the key each override of a command
line sets. Plain data: the planner (experiment/settings.py) and the reports (reports/runs.py: what makes two runs
different settings) read them alike.
"""

from __future__ import annotations

import functools
from typing import Any

from core.errors import PosGPTError

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


def overridden_keys(overrides: list[str] | tuple[str, ...]) -> list[str]:
    """The dotted key or group each Hydra override sets (``data=text`` -> data, ``+eval.x=1`` -> eval.x, ``~eval.x``
    -> eval.x), read by Hydra's own parser: the one reading of an override's key, for the planner, the scripts' option
    checks (core/cli.py) and the study runners alike."""
    # imported here: what imports core needs no Hydra (model/ runs without it), and a refused option stays quick
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as error:
        lines = (line.strip().rstrip(".") for line in str(error).splitlines() if line.strip())
        raise PosGPTError("; ".join(lines)) from None
    return [override.key_or_group for override in parsed]
