"""Checkpoints: written atomically, loaded safely.

A checkpoint is a plain dict of tensors and Python primitives (model and optimizer state, scheduler,
step, RNG states, the data sampler's generator state, the resolved config, the Hydra overrides that made
it and the W&B run id), so it loads with ``torch.load(weights_only=True)``: a file from elsewhere cannot run
code. Saving goes to a temporary file in the same directory, fsync, then ``os.replace`` (core.files.atomic_write):
a crash or kill -9 mid-save leaves the previous ``last.pt`` intact (and a temporary file, which the next save
removes), and so does a full disk or a missing permission, reported as one line (a MachineFault) naming the file.
"""

from __future__ import annotations

import os
import pickle
import re
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from core.errors import PosGPTError
from core.files import TMP_PREFIX, atomic_write, make_folder, remove, write_fault
from core.rundir import CHECKPOINT_DIR
from core.stored import check_literal

LAST = "last.pt"
FORMAT_VERSION = 1
_STEP_FILE = re.compile(r"step_(\d+)\.pt$")


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def last_checkpoint_path(run_dir: str | Path) -> Path:
    return checkpoint_dir(run_dir) / LAST


def save_checkpoint(state: dict[str, Any], run_dir: str | Path, keep: int) -> Path:
    """Write ``last.pt`` and ``step_<N>.pt`` (hard link, no extra space), keeping the newest ``keep`` of the latter."""
    directory = checkpoint_dir(run_dir)
    last = directory / LAST
    try:
        make_folder(directory, run_dir)
        for stale in directory.glob(f"{TMP_PREFIX}*"):  # left by a save that was killed (only rank 0 saves)
            remove(stale, run_dir)
    except OSError as error:
        raise write_fault(last, error) from None
    state = {**state, "format_version": FORMAT_VERSION}
    atomic_write(last, lambda f: torch.save(state, f), run_dir)
    if keep > 0:
        step_file = directory / f"step_{state['step']:08d}.pt"
        try:
            remove(step_file, run_dir)
            os.link(last, step_file)
        except OSError:  # file systems without hard links
            atomic_write(step_file, lambda f: torch.save(state, f), run_dir)
        old = sorted(p for p in directory.iterdir() if _STEP_FILE.search(p.name))[:-keep]
        for path in old:
            remove(path, run_dir)
    return last


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a posgpt checkpoint, turning every way it can be broken into one clear PosGPTError."""
    path = Path(path)
    if path.suffix != ".pt":  # a run directory
        if not path.is_dir():
            raise PosGPTError(f"run directory {path} does not exist")
        path = last_checkpoint_path(path)
    if path.is_dir():
        raise PosGPTError(f"{path} is a directory, not a checkpoint file")
    if not path.is_file():
        raise PosGPTError(f"no checkpoint at {path}: this run has not saved one (train with hydra.run.dir=...)")
    try:
        # Bytes that are not a checkpoint make torch warn (e.g. "Detected pickle protocol 17") before it fails:
        # the failure below is the one line the user sees, so what torch says about the bytes is not printed.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location=map_location, weights_only=True)
    except PermissionError as error:
        raise PosGPTError(f"cannot read the checkpoint {path} ({error.strerror})") from None
    # Bytes that are not a checkpoint fail in the unpickler in many ways (a STOP opcode on an empty stack is an
    # IndexError, an unknown memo key a KeyError, ...): each is a broken file, not a bug of ours.
    except (
        EOFError,
        RuntimeError,
        pickle.UnpicklingError,
        zipfile.BadZipFile,
        ValueError,
        OSError,
        IndexError,
        KeyError,
        TypeError,
        AttributeError,
    ) as error:
        raise PosGPTError(
            f"checkpoint {path} is truncated or not a posgpt checkpoint ({type(error).__name__})"
        ) from None
    required = {"model", "step", "config", "format_version"}
    if not isinstance(state, dict) or not required <= state.keys():
        found = set(state) if isinstance(state, dict) else set()
        raise PosGPTError(f"{path} is not a posgpt checkpoint (missing {sorted(required - found)})")
    if not isinstance(state["model"], dict):
        kind = type(state["model"]).__name__
        raise PosGPTError(f"{path} is not a posgpt checkpoint (its model weights are a {kind}, not a dict)")
    for key in ("step", "format_version"):  # a bool is an int to Python, never a count here
        value = state[key]
        if type(value) is not int or value < 0:
            raise PosGPTError(f"{path} is not a posgpt checkpoint (its {key} is {value!r}, not a count)")
    if state["format_version"] > FORMAT_VERSION:
        raise PosGPTError(f"{path} was written by a newer posgpt (format {state['format_version']})")
    check_literal(state["config"], str(path))
    return state


def checkpoint_file(path: str | Path) -> Path:
    """The file :func:`load_checkpoint` reads for ``path`` (a run directory or a ``.pt`` file), for messages."""
    path = Path(path)
    return path if path.suffix == ".pt" else last_checkpoint_path(path)


def load_weights(model: torch.nn.Module, weights: Mapping[str, Any], source: str | Path) -> None:
    """Load a checkpoint's model weights into ``model`` after :func:`check_weights`: nothing is loaded unless every
    parameter is there with its shape, so a model never runs with a weight left at its initialisation."""
    check_weights(model.state_dict(), weights, source)
    model.load_state_dict(weights)


def check_weights(expected: Mapping[str, torch.Tensor], weights: Mapping[str, Any], source: str | Path) -> None:
    """:class:`WeightsMismatch` naming the first parameter (in the model's order) that ``weights`` lacks, holds with
    another shape or with non-finite values, or holds besides the model's: a checkpoint whose config no longer
    describes its weights (an edit, a file copied from another run, a half-migrated format) or that lost a weight or
    was damaged."""
    for name, tensor in expected.items():
        theirs = weights.get(name)
        if not isinstance(theirs, torch.Tensor):
            what = "has no" if theirs is None else f"holds a {type(theirs).__name__} as"
            raise WeightsMismatch(
                f"checkpoint {source} is incomplete: it {what} {name} (shape {list(tensor.shape)} in the model "
                "its config describes); nothing was loaded",
                name,
            )
        if theirs.shape != tensor.shape:
            raise WeightsMismatch(
                f"checkpoint {source} does not fit the model its config describes: {name} has shape "
                f"{list(theirs.shape)} in the checkpoint but {list(tensor.shape)} in the model; nothing was loaded",
                name,
                list(theirs.shape),
                list(tensor.shape),
            )
    # Training stops at a non-finite loss before it saves (or skips the step), so such a weight is damage.
    damaged = next((name for name in expected if not torch.isfinite(weights[name]).all()), None)
    if damaged is not None:
        raise WeightsMismatch(
            f"checkpoint {source} is damaged: {damaged} holds NaN or infinite values; nothing was loaded", damaged
        )
    unexpected = next((name for name in weights if name not in expected), None)
    if unexpected is not None:
        raise WeightsMismatch(
            f"checkpoint {source} does not fit the model its config describes: it holds {unexpected}, which the "
            "model has not; nothing was loaded",
            unexpected,
        )


class WeightsMismatch(PosGPTError):
    """A checkpoint's weights do not fit its model: ``name`` is the first parameter that does not, and for a shape
    mismatch ``shapes`` are (the checkpoint's, the model's)."""

    def __init__(self, message: str, name: str, *shapes: list[int]) -> None:
        super().__init__(message)
        self.name, self.shapes = name, shapes
