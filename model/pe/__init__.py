"""Registry of positional schemes: every module in this package that defines a PositionalEncoding subclass
that sets its own ``name`` is discovered here, so adding a scheme never touches this file. (A subclass that keeps
its parent's name is a form of the parent that the parent builds itself, as PaTH-FoX is of PaTH.)

Each scheme's config dataclass (``config_class``) is registered with Hydra's ConfigStore as ``schema/pe/<name>``
by experiment/config.py (model/ itself runs without Hydra); the YAML file ``configs/pe/<name>.yaml`` lists it
in its defaults, so misspelt or mistyped keys fail at start-up.
"""

from __future__ import annotations

import importlib
import pkgutil

from core.errors import PosGPTError
from model.pe.base import ModelDims, PEConfig, PositionalEncoding, PositionState

SCHEMES: dict[str, type[PositionalEncoding]] = {}


def _discover() -> None:
    for module_info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, PositionalEncoding) and vars(obj).get("name"):
                SCHEMES[obj.name] = obj


def build_positional_encoding(cfg: PEConfig, dims: ModelDims) -> PositionalEncoding:
    if cfg.name not in SCHEMES:
        raise PosGPTError(f"unknown positional scheme pe={cfg.name!r}; choose one of {sorted(SCHEMES)}")
    return SCHEMES[cfg.name](cfg, dims)


_discover()

__all__ = [
    "SCHEMES",
    "ModelDims",
    "PEConfig",
    "PositionalEncoding",
    "PositionState",
    "build_positional_encoding",
]
