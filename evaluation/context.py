"""The trained run an evaluation scores, in one object: built once (by eval.py, or by training when it ends) and
handed to every evaluator (perplexity by protocol, task accuracy, the copy probe), so that none of them rebuilds
the lengths, reaches into another's module, or takes a dozen loose arguments.

It also says what scored a row (:meth:`EvalContext.provenance`), which every results file's writer stamps on each
new row: the evaluator and the settings of it that the row depends on, the identity of the weights (a digest of the
model's state as it was scored, :func:`weights_digest`), the training step, the scheme, the run's training seed, and
how many tokens or examples were scored. Rows written before these were recorded lack them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from core.rundir import EVAL_DIR
from model.temperature import temperature_settings

# A run directory -> the model its checkpoint holds (built from the config it records, its weights loaded), the task
# it was trained on, and the checkpoint's step: what the planner hands an evaluator that reads another run
# (experiment/build.py).
OpenRun = Callable[[str], tuple[torch.nn.Module, str, int]]


@dataclass
class EvalContext:
    """What the planner (experiment/eval_checks.py: evaluation_plan, then EvaluationPlan.context) hands every evaluator
    of a run, and nothing of the config besides: the model and where it runs; the run's directory, the config its
    checkpoint records (written into every results document) and the checkpoint's step; the evaluated lengths, resolved
    once; what a row records of the trained run (its scheme, training length, seed, attention temperature and backend);
    the scored corpus's settings (data/config.py's DataConfig; None for a task run) or the task's (a task run); the
    scheme's evaluation-time variations asked for; W&B's run; and how an evaluator opens another run."""

    model: torch.nn.Module
    run_dir: Path
    device: torch.device
    dtype: torch.dtype
    trained_config: dict[str, Any]
    step: int
    lengths: list[int]
    scheme: str
    train_len: int
    train_seed: int
    data: Any = None
    task: Any = None
    variation_names: list[str] = dataclasses.field(default_factory=list)
    attn_temperature: Any = None
    attn_backend: str = "auto"
    attn_sink: bool = False
    train_random_positions: int | None = None
    progress: bool = False
    wandb_run: Any = None
    open_run: OpenRun | None = None

    @property
    def eval_dir(self) -> Path:
        return self.run_dir / EVAL_DIR

    @functools.cached_property
    def weights(self) -> str | None:
        """The digest of the scored weights (None without a model)."""
        return None if self.model is None else weights_digest(self.model)

    def provenance(self, row: dict[str, Any], evaluator: str, settings: dict[str, Any]) -> dict[str, Any]:
        """``row`` with what scored it: ``evaluator`` and its ``settings`` (the eval.* values it depends on), the
        weights' digest, the step, the scheme, the training seed, and the number scored (its tokens, else its
        examples)."""
        scored, unit = (row.get("tokens"), "tokens") if "tokens" in row else (row.get("n"), "examples")
        return {
            **row,
            "evaluator": evaluator,
            "evaluator_settings": {name: _plain(value) for name, value in settings.items()},
            "weights": self.weights,
            "step": self.step,
            "scheme": self.scheme,
            "train_seed": self.train_seed,
            "scored": scored,
            "scored_unit": unit,
        }

    def variations(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Each of the scheme's evaluation-time variations asked for (eval.variations, else the run as configured),
        applied to the model while the caller scores it: yields its label and the fields a row records of it."""
        for label, settings in self.model.pe.eval_variations(list(self.variation_names)):
            with self.model.pe.evaluated_with(settings):
                yield label, variation_fields(label, settings, self.attn_temperature)


@dataclass(frozen=True)
class EvaluationPlan:
    """What an evaluation reads of a run's config, planned once (experiment/eval_checks.py: evaluation_plan), typed; the
    :class:`EvalContext` of each evaluation adds to it what only the evaluation has (the model, the device, the
    trained config, the step scored, W&B's run). ``step``: the step a run that has just trained reaches."""

    step: int
    lengths: tuple[int, ...]
    scheme: str
    train_len: int
    train_seed: int
    data: Any = None
    task: Any = None
    variation_names: tuple[str, ...] = ()
    attn_temperature: Any = None
    attn_backend: str = "auto"
    attn_sink: bool = False
    train_random_positions: int | None = None
    evaluators: tuple[str, ...] = ()  # the names of the evaluators that run (eval.evaluators and the switches)
    progress: bool = False

    def context(
        self,
        model: torch.nn.Module | None,
        run_dir: str | Path,
        device: torch.device,
        dtype: torch.dtype,
        trained: dict[str, Any],
        step: int | None = None,
        wandb_run: Any = None,
        open_run: OpenRun | None = None,
    ) -> EvalContext:
        """The context of one evaluation of ``model`` (``step`` None: the step training reaches)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields.update(lengths=list(self.lengths), variation_names=list(self.variation_names))
        del fields["evaluators"]  # the evaluation has the evaluators themselves
        fields["step"] = self.step if step is None else step
        return EvalContext(
            model=model,
            run_dir=Path(run_dir),
            device=device,
            dtype=dtype,
            trained_config=trained,
            wandb_run=wandb_run,
            open_run=open_run,
            **fields,
        )


def evaluated_lengths(lengths: Sequence[int] | None, multipliers: Sequence[float], train_len: int) -> list[int]:
    """The evaluation lengths: ``lengths`` (eval.lengths) if given, else the ``multipliers`` times the training
    length, rounded to the nearest whole token (0.75 x 64 = 48)."""
    return list(lengths) if lengths else [round(m * train_len) for m in multipliers]


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of the model's state (every parameter and buffer: name, dtype, shape and bytes, in name order), the
    first 16 hex digits: two rows with the same digest were scored by the same weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}:".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def _plain(value: Any) -> Any:
    """An eval.* value as JSON holds it (a tuple or a ListConfig as a list)."""
    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value)
    return list(value) if isinstance(value, tuple) else value


def as_plain(value: Any) -> Any:
    """A setting's value as JSON can hold it (a dataclass, such as a scheme's nested config, becomes a dict)."""
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def variation_fields(label: str, settings: dict[str, Any], attn_temperature: Any) -> dict[str, Any]:
    """What a result row (perplexity, task, copy probe) records of what its model was evaluated with besides its
    weights: the scheme's evaluation-time variation (its label and settings) and the attention temperature
    (``model.attn_temperature``)."""
    return {
        "variation": label,
        "variation_settings": {name: as_plain(value) for name, value in settings.items()},
        "attn_temperature": temperature_settings(attn_temperature),
    }
