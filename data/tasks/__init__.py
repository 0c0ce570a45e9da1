"""Registry of synthetic tasks: every module in this package that defines a Task subclass with a ``name`` is
discovered here, so adding a task is one module plus ``configs/task/<name>.yaml`` and touches nothing else.

Each task's config dataclass (``config_class``) is registered with Hydra's ConfigStore as ``schema/task/<name>``
by experiment/config.py; ``task=none`` (TaskConfig itself) is language modelling on data.*.

    task = build_task(PasskeyConfig())
    x, y = task.sample(32, 64, torch.Generator().manual_seed(0))   # y: -100 except on the answer tokens
"""

from __future__ import annotations

import importlib
import pkgutil

from core.errors import PosGPTError
from data.tasks.base import Task, TaskConfig, held_out_seed

TASKS: dict[str, type[Task]] = {}
NO_TASK = "none"


def _discover() -> None:
    for module_info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Task) and obj.name:
                TASKS[obj.name] = obj


def task_config_class(name: str) -> type[TaskConfig]:
    if name == NO_TASK:
        return TaskConfig
    if name not in TASKS:
        raise PosGPTError(f"unknown task={name!r}; choose one of {sorted([NO_TASK, *TASKS])}")
    return TASKS[name].config_class


def build_task(cfg: TaskConfig) -> Task | None:
    """The task ``cfg`` describes (its settings checked), or None for language modelling."""
    if cfg.name == NO_TASK:
        return None
    task_config_class(cfg.name)  # an unknown name is refused with the choices
    task = TASKS[cfg.name](cfg)
    task.check()
    return task


_discover()

__all__ = ["NO_TASK", "TASKS", "Task", "TaskConfig", "build_task", "held_out_seed", "task_config_class"]
