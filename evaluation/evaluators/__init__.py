"""The built-in evaluators, one module each: every module here that defines an Evaluator subclass with its own
``name`` registers it (evaluation/evaluator.py), so adding a metric is adding a module here; nothing else lists
them."""

from __future__ import annotations

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
