"""What a command reads back from a run directory is data: a stored config is taken literally.

A checkpoint's config, a results file's config and a run's ``.hydra/`` record were written by posgpt from a
resolved config, so none holds an interpolation. One that does (``${oc.env:HOME}``, ``${no.such.key}``) came from
elsewhere: OmegaConf would resolve it when the config is typed, read an environment variable or fail with its own
traceback, and the value would reach the results. :func:`check_literal` refuses it in one line naming the file,
where the file is read (core.checkpoint_io, evaluation.store) and again where a stored config is typed
(experiment.settings.trained_config). Only what the user gives (the command line, their own yaml) is resolved.
"""

from __future__ import annotations

from typing import Any

from core.errors import PosGPTError

# OmegaConf's marker of an interpolation (its escaped form, "\\${", holds it too and is refused with it).
INTERPOLATION = "${"


def _unsafe_entries(value: Any, key: str) -> list[tuple[str, str]]:
    if isinstance(value, dict):
        found = [(f"{key}.{name}".lstrip("."), str(name)) for name in value if isinstance(name, str) and _marked(name)]
        for name, item in value.items():
            found += _unsafe_entries(item, f"{key}.{name}".lstrip("."))
        return found
    if isinstance(value, list | tuple):
        return [entry for index, item in enumerate(value) for entry in _unsafe_entries(item, f"{key}[{index}]")]
    return [(key, value)] if isinstance(value, str) and _marked(value) else []


def _marked(text: str) -> bool:
    return INTERPOLATION in text


def check_literal(config: Any, source: str) -> Any:
    """``config`` (a plain dict read back from ``source``) as it is, or a PosGPTError naming ``source`` and the first
    key whose name or value OmegaConf would not take literally (an interpolation)."""
    found = _unsafe_entries(config, "")
    if found:
        key, value = found[0]
        raise PosGPTError(
            f"{source}: its stored config holds {key}={value!r}, which would be resolved as an interpolation; a "
            "stored config is read literally, never resolved: fix or drop the file (nothing was written)"
        )
    return config
