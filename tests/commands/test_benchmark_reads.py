"""The benchmarks read every train.* setting the schema declares them readers of: for each such setting of
scripts/speed.py and scripts/estimate.py, generated from the schema (tests/support/generated_settings.py: each
declared choice, a flipped switch, each numeric domain's edge), the value reaches what the benchmark builds and runs
(its runtime, optimizer, schedule, training step, batch, compilation, memory prediction), or the benchmark refuses it
in one line. A declared reader that reads nothing (the setting accepted and dropped) fails here.

The benchmarks run in this process through their own functions, on a tiny model, one step, what they build spied on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import typing

import pytest
import torch
from cli_runs import load_script
from generated_settings import generated_settings
from omegaconf import OmegaConf

from core.config_keys import flatten_config
from core.errors import PosGPTError
from core.runtime import RuntimeSettings
from experiment.compose import compose_config
from experiment.config import TrainConfig, command_reads

speed, estimate = load_script("speed"), load_script("estimate")
TINY = ["model=tiny", "model.vocab_size=128", "train.seq_len=16", "train.batch_size=2", "train.num_threads=1"]


def read_by(script: str) -> list[tuple[str, ...]]:
    """The generated train.* settings whose key ``script`` reads, as the schema declares."""
    config = OmegaConf.to_object(compose_config([]))
    settings = generated_settings(TrainConfig, "train.") + generated_settings(type(config.train.pose), "train.pose.")
    keys = [setting[-1].split("=", 1)[0] for setting in settings]
    return [s for s, key in zip(settings, keys, strict=True) if command_reads(config, f"scripts/{script}.py", key)]


def plain(value) -> str | None:
    """A value as what was handed on: a number, a word, a dtype, a device, a settings type's fields; None for an
    object (a model, an optimizer), whose own settings were recorded where it was built."""
    if isinstance(value, bool | int | float | str | torch.dtype | torch.device) or value is None:
        return repr(value)
    if dataclasses.is_dataclass(value) and type(value).__module__ != "experiment.config":  # a stage's settings
        return repr(value)
    return None


def spied(monkeypatch, module) -> list:
    """What ``module`` hands the stages it builds, in the order it hands it: the runtime the fields it reads
    (core.runtime.RuntimeSettings), the optimizer and its schedule their settings, the training step its numbers,
    the memory model its prediction; the batches' shapes; whether it compiles."""
    seen = []

    def spy(name, record):
        real = getattr(module, name)

        def call(*args, **kwargs):
            result = real(*args, **kwargs)
            seen.append((name, record(args, kwargs, result)))
            return result

        monkeypatch.setattr(module, name, call)

    runtime = list(typing.get_type_hints(RuntimeSettings))
    handed = lambda args, kwargs, result: [plain(v) for v in (*args, *kwargs.values())]  # noqa: E731
    spy("set_up_runtime", lambda args, kwargs, result: [getattr(args[0], name) for name in runtime])
    for name in ("build_optimizer", "build_scheduler", "TrainStep"):
        spy(name, handed)
    if hasattr(module, "training_memory"):
        spy("training_memory", lambda args, kwargs, result: result.mib())
    real_randint = torch.randint
    monkeypatch.setattr(module.torch, "randint", lambda *a, **k: seen.append(("batch", a[2])) or real_randint(*a, **k))
    monkeypatch.setattr(module.torch, "compile", lambda model, **k: seen.append(("compile", k)) or model)
    return seen


def run_speed(overrides: list[str]) -> None:
    args, rest = speed.parse_args(["--warmup", "0", "--steps", "1", *overrides])
    speed.bench_scheme(compose_config(rest), args)


def run_estimate(overrides: list[str]) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        estimate.main.__wrapped__(["--measure", *overrides])  # undecorated: a refusal is a PosGPTError


RUNS = {"speed": (speed, run_speed), "estimate": (estimate, run_estimate)}


def fingerprint(script: str, overrides: list[str], monkeypatch) -> list | str:
    """What the benchmark built and ran with ``overrides`` (or its refusal's line)."""
    module, run = RUNS[script]
    with monkeypatch.context() as patch:
        seen = spied(patch, module)
        try:
            run([*TINY, *overrides])
        except PosGPTError as error:
            return f"refused: {error}"
    return [str(entry) for entry in seen]


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(RUNS))
def test_every_setting_a_benchmark_is_declared_to_read_changes_what_it_runs(script, monkeypatch):
    settings = read_by(script)
    assert {"train.lr", "train.batch_size", "train.seed"} <= {s[-1].split("=", 1)[0] for s in settings}
    default = fingerprint(script, [], monkeypatch)
    assert isinstance(default, list), default
    assert fingerprint(script, [], monkeypatch) == default  # what is compared is the same for the same settings
    defaults = flatten_config(OmegaConf.to_container(compose_config(TINY)))
    for setting in settings:
        key, value = setting[-1].split("=", 1)
        if str(defaults.get(key)).lower() == value.lower():  # an edge that is the default itself
            continue
        got = fingerprint(script, list(setting), monkeypatch)
        assert got != default, f"{script} accepts {' '.join(setting)} and runs as without it"
