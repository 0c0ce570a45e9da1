"""Config composition, and Hydra's errors turned into posgpt's one-line user errors.

train.py composes through ``@hydra.main`` (multirun, launchers, ``hydra.run.dir``) inside
:func:`hydra_errors_as_user_errors`; eval.py, scripts/speed.py and sample.py call :func:`compose_config`.
Either way a misspelt key, a wrong type or an unknown group option ends as ``error: <one line>`` and exit
code 2, the valid choices listed on that line.

:func:`compose_config` keeps Hydra's composition of the config files an override list chooses, once per choice,
and applies the values given on top with Hydra's own function (tests/experiment/test_compose.py holds it to what
Hydra composes): after the first, each composition with the same choices (a sweep's or a study's jobs over seeds
and values, a property test's settings) takes milliseconds instead of Hydra's tens.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from core.errors import PosGPTError
from core.files import first_invalid_utf8, not_utf8, open_file_in
from core.rundir import note_existing
from experiment import CONFIG_DIR
from experiment.config import choices_with, register_configs

# Lines of Hydra's and OmegaConf's messages that help a developer, not a user (or, like Hydra's "To append to
# your config use +key=...", suggest what experiment.config.validate then refuses).
_NOISE = re.compile(
    r"^\s*(full_key:|object_type=|reference_type=|To append to your config use|Set the environment "
    r"variable HYDRA_FULL_ERROR)"
)


def one_line(error: BaseException) -> str:
    """Hydra's multi-line message (and its OmegaConf cause) as one line; option lists become ``a, b, c``."""
    lines = str(error).splitlines()
    cause = error.__cause__
    if isinstance(cause, OmegaConfBaseException) and str(cause) not in str(error):
        lines += str(cause).splitlines()
    parts: list[str] = []
    for line in lines:
        if line.startswith("Config search path"):  # where Hydra looked: the rest of the message
            break
        if not line.strip() or _NOISE.match(line):
            continue
        if line.startswith("\t") and parts and parts[-1].endswith(":"):  # the first listed option
            parts[-1] += " " + line.strip()
        elif line.startswith("\t") and parts:
            parts[-1] += ", " + line.strip()
        else:
            parts.append(line.strip().rstrip("."))
    return "; ".join(parts)


@contextlib.contextmanager
def hydra_errors_as_user_errors() -> Iterator[None]:
    """Turn Hydra's and OmegaConf's exceptions raised inside into PosGPTError (one line).

    Hydra prints its own multi-line errors unless HYDRA_FULL_ERROR is set, so it is set here (when the user has
    not set it) to let them reach this function.
    """
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    try:
        yield
    except (HydraException, OmegaConfBaseException) as error:
        message = one_line(error)
        raise PosGPTError(message + _group_hint(message) + _reader_hint(message)) from None
    except (yaml.YAMLError, UnicodeDecodeError) as error:  # a config file (--config-dir ...) that is not YAML
        raise _config_file_error(error) from None
    except (FileExistsError, NotADirectoryError) as error:  # hydra.run.dir names a file (or a path through one)
        raise PosGPTError(f"cannot make the directory {error.filename}: a file is in the way; choose another") from None


_GROUP_ASSIGNED = re.compile(r"Error merging override ([\w.]+)=.*is not a subclass of \w+Config")


def _group_hint(message: str) -> str:
    """``logging.wandb=false`` gives a value to a group of settings: say to set one of its keys instead."""
    match = _GROUP_ASSIGNED.search(message)
    if match is None:
        return ""
    key = match.group(1)
    return f" ({key} is a group of settings: set one of them, {key}.<name>=..., listed in docs/configuration.md)"


_NOT_IN_CHOICE = re.compile(r"Could not override '((?:task|pe)\.[\w.]+)'; Key '\w+' not in '\w+'")


def _reader_hint(message: str) -> str:
    """A setting of another task or scheme than the run's: say which would read it."""
    match = _NOT_IN_CHOICE.search(message)
    readers = choices_with(match.group(1)) if match else []
    return f"; {match.group(1)} is read by {', '.join(readers)}" if readers else ""


def _config_file_error(error: yaml.YAMLError | UnicodeDecodeError) -> PosGPTError:
    """A config file that is not UTF-8 (the byte where it fails) or not YAML (the line), as one line."""
    file = open_file_in(error)
    name = file.name if file is not None else "a config file"
    if isinstance(error, UnicodeDecodeError):
        offset, reason = (file and first_invalid_utf8(file.name)) or (error.start, error.reason)
        return not_utf8("config", name, offset, reason)
    mark = getattr(error, "problem_mark", None)
    if mark is None:
        return PosGPTError(f"config {name} is not valid YAML: {' '.join(str(error).split())}")
    return PosGPTError(
        f"config {mark.name}, line {mark.line + 1}, column {mark.column + 1}: not valid YAML ({error.problem})"
    )


class NoteNewRunDirs(Callback):
    """Hydra makes the run directory (and its missing parents) before train.py can check the command: note what
    exists beforehand, so that a refused command removes what was made for it (core.rundir.removed_if_unused).
    Configured in configs/config.yaml (hydra.callbacks)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._note(config, "run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._note(config, "sweep.dir")

    @staticmethod
    def _note(config: DictConfig, key: str) -> None:
        try:
            directory = OmegaConf.select(config.hydra, key, throw_on_resolution_failure=True)
        except OmegaConfBaseException:  # it interpolates what only the job knows: nothing is noted, nothing removed
            return
        note_existing(directory)


# Hydra's flags that choose another primary config: its jobs cannot be composed from configs/ ahead of the run.
_CONFIG_FLAGS = ("-cp", "-cn", "-cd", "--config-path", "--config-name", "--config-dir")


def sweep_jobs(argv: list[str]) -> list[list[str]]:
    """The overrides of every job of a multirun command line (``-m``/``--multirun``, as Hydra's basic sweeper
    expands ``pe=rope,alibi train.seed=1,2``), less Hydra's own (``hydra.*``, ``hydra/launcher=...``); none for a
    single run or one composed from another primary config."""
    if not {"-m", "--multirun"} & set(argv) or any(a.split("=")[0] in _CONFIG_FLAGS for a in argv):
        return []
    overrides = [a for a in argv if not a.startswith(("-", "hydra.", "hydra/", "+hydra", "~hydra"))]
    parsed = OverridesParser.create().parse_overrides(overrides)
    return [job for batch in BasicSweeper.split_arguments(parsed, max_batch_size=None) for job in batch]


# Where a run of no named directory would write: Hydra makes a new one (its name holds the time), so nothing is there.
NEW_RUN_DIR = Path("<a new run directory>")


def planned_run_dirs(argv: list[str], jobs: int) -> list[Path]:
    """The run directory of each of ``jobs`` jobs of the command line ``argv`` (one for a single run), as Hydra
    will name it: ``hydra.run.dir``, or ``hydra.sweep.dir``/<job number> under the default subdirectory; a name
    Hydra makes at run time (``${now:...}``, another subdirectory) is a new directory, :data:`NEW_RUN_DIR`."""
    named_by = [argument for argument in argv if argument.startswith("hydra.") and "=" in argument]
    # read as Hydra reads them (a quoted path is the path, not its quotes)
    given = {o.key_or_group: str(o.value()) for o in OverridesParser.create().parse_overrides(named_by)}
    multirun = bool({"-m", "--multirun"} & set(argv))
    if not multirun:
        named = given.get("hydra.run.dir")
        return [NEW_RUN_DIR if named is None or "${" in named else Path(named)]
    sweep = given.get("hydra.sweep.dir")
    if sweep is None or "${" in sweep or "hydra.sweep.subdir" in given:
        return [NEW_RUN_DIR] * jobs
    return [Path(sweep) / str(number) for number in range(jobs)]


def check_group_choices(argv: list[str]) -> None:
    """A config group (``pe=``, ``model=``, ...) is chosen by the name of one of its files (or a list of names).
    Hydra meets a number, a bool or null there with a bare ValueError (a traceback) and a mapping (``model={}``)
    by composing the defaults as if nothing were asked: refused here, naming the override and the choices."""
    groups = {path.name: path for path in CONFIG_DIR.iterdir() if path.is_dir() and path.name != "hydra"}
    parser = OverridesParser.create()
    for argument in argv:
        try:
            (override,) = parser.parse_overrides([argument])
        except (HydraException, ValueError):  # a flag, a flag's value, or a line Hydra refuses itself
            continue
        if override.key_or_group not in groups or override.is_delete():
            continue
        values = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
        for value in values:
            names = value if isinstance(value, list) else [value]
            if not all(isinstance(name, str) for name in names):
                group = override.key_or_group
                choices = ", ".join(sorted(path.stem for path in groups[group].glob("*.yaml")))
                raise PosGPTError(f"{argument}: {group} chooses a file of configs/{group}/ by name ({choices})")


def compose_config(overrides: list[str]) -> DictConfig:
    """configs/config.yaml with ``overrides`` applied, as train.py would compose it (without the hydra node).

    Hydra composes in two steps: the defaults list, from the overrides that choose config files (``pe=rope``),
    then each override of a value (``train.seed=1``) applied in order to the composed config. The first step is
    most of a composition's time and depends only on those choices, so its result is kept per choice and copied;
    the values are then applied by Hydra's own function, as its composition applies them."""
    check_group_choices(overrides)
    register_configs()
    with hydra_errors_as_user_errors():
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        choices = tuple(override.input_line for override in parsed if not _sets_a_value(override))
        cfg = copy.deepcopy(_composed_defaults(choices))
        ConfigLoaderImpl._apply_overrides_to_config([o for o in parsed if _sets_a_value(o)], cfg)
    return cfg


def _sets_a_value(override: Override) -> bool:
    """Whether Hydra applies ``override`` after composing the defaults: a dotted key's value (set, added or
    deleted). A group or package choice, anything of Hydra's own node and a sweep (which a single composition
    refuses) are composed by Hydra itself."""
    key = override.key_or_group
    dotted = "." in key and "/" not in key and key.split(".", 1)[0] != "hydra"
    return dotted and override.package is None and not override.is_sweep_override()


@functools.lru_cache(maxsize=256)
def _composed_defaults(choices: tuple[str, ...]) -> DictConfig:
    """Hydra's composition of configs/config.yaml with the overrides ``choices``; never handed out, only copied."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose("config", overrides=list(choices))
