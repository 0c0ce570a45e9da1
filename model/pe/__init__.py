"""Registry of positional schemes: every module in this package that defines a PositionalEncoding subclass
with a ``name`` is discovered here, and so is its SchemeRecord (how plots and tables show it, the variations a
study evaluates it with, its checkpoints' legacy values), so adding a scheme never touches this file.

Each scheme's config dataclass (``config_class``) is registered with Hydra's ConfigStore as ``schema/pe/<name>``
by experiment/config.py (model/ itself runs without Hydra); the YAML file ``configs/pe/<name>.yaml`` lists it
in its defaults, so misspelt or mistyped keys fail at start-up.
"""

from __future__ import annotations

import importlib
import pkgutil

from core.errors import PosGPTError
from model.pe.base import ModelDims, PEConfig, PositionalEncoding, PositionState, SchemeRecord

SCHEMES: dict[str, type[PositionalEncoding]] = {}
RECORDS: dict[str, SchemeRecord] = {}


def _discover() -> None:
    for module_info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, PositionalEncoding) and obj.name:
                SCHEMES[obj.name] = obj
            elif isinstance(obj, SchemeRecord):
                RECORDS[obj.scheme] = obj


def record(name: str) -> SchemeRecord:
    """Scheme ``name``'s record (the defaults where its module declares none, or for a name no scheme has)."""
    return RECORDS.get(name) or SchemeRecord(name)


def build_positional_encoding(cfg: PEConfig, dims: ModelDims) -> PositionalEncoding:
    if cfg.name not in SCHEMES:
        raise PosGPTError(f"unknown positional scheme pe={cfg.name!r}; choose one of {sorted(SCHEMES)}")
    return SCHEMES[cfg.name](cfg, dims)


def display_name(name: str) -> str:
    """How comparison tables name scheme ``name`` (its record's display_name, else the name itself)."""
    return record(name).display_name or name


_discover()

__all__ = [
    "RECORDS",
    "SCHEMES",
    "SchemeRecord",
    "ModelDims",
    "PEConfig",
    "PositionalEncoding",
    "PositionState",
    "build_positional_encoding",
    "display_name",
    "record",
]
