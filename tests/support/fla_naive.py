"""flash-linear-attention's naive PyTorch references (PyPI ``fla-core``, a test-only dependency, requirements-dev.txt),
each loaded from its own file: importing the package would import every Triton kernel it has, which a CPU-only machine
cannot."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path


def naive_reference(op: str, function: str) -> Callable:
    """``function`` of ``fla/ops/<op>/naive.py``."""
    spec = importlib.util.find_spec("fla")
    if spec is None:
        raise ModuleNotFoundError("fla-core is a test dependency: pip install -r requirements-dev.txt")
    path = Path(next(iter(spec.submodule_search_locations))) / "ops" / op / "naive.py"
    module_spec = importlib.util.spec_from_file_location(f"fla_{op}_naive", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return getattr(module, function)
