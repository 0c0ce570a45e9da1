"""What an evaluator is: a plug-in that scores a trained run and returns rows.

An evaluator is a subclass of :class:`Evaluator` that sets its own ``name``. Defining it registers it (the
modules of evaluation/evaluators/ are imported by that package, so adding one there touches no other file; a
subclass defined anywhere else, a test module say, registers the same way). It declares:

- ``runs``: the kind of run it scores ("text": a language-model run; "task": a run of a synthetic task);
- ``order``: evaluators run in ascending order (then by name): 0 for those that score the run itself, more for
  probes that come after them;
- ``Settings``: a frozen dataclass whose fields are the ``eval.*`` keys it reads, filled from the evaluation's
  settings by field name by :meth:`Evaluator.of` (its typed settings; the rest of the config never reaches it). A
  built-in evaluator declares there, with its default, domain and comment, each setting only it reads, and inherits
  those several read from the small types of evaluation/settings.py (``TokenBudget``: ``eval.max_tokens``,
  ``Batching``: ``eval.batch_tokens``, ...): the schema's ``eval`` section is made from those declarations
  (experiment/config.py, ``EvalConfig``), so each setting is declared once. The schema is made when experiment/config.py
  is imported, from the evaluators of evaluation/evaluators/ alone: a plug-in defined elsewhere reads settings they
  declare (by inheriting their types, or with fields of the same names and no default) and adds none. A settings
  type's ``check`` (evaluation/settings.py) refuses a value of its own fields that the evaluation cannot produce:
  the planner runs those of every type of the eval section before any work, whether its evaluator is selected or not;
- ``recorded``: those of them each row depends on besides its own fields, stamped on every row it writes;
- ``rows``: the results file its rows go to and how they are keyed and shown (evaluation/store.py's RowFormat;
  evaluation/value_format.py's value_rows for one number per length);
- :meth:`requested`: whether the evaluation's settings ask for it when ``eval.evaluators`` is not given;
- :meth:`check`: its refusals, raised before any evaluator scores anything or anything is written;
- :meth:`run`: its rows, scored on the run's context (evaluation/context.py) and the scored tokens;
- :meth:`header`, :meth:`finish`, :meth:`plot_options`: what its results document records besides the rows, what is
  computed over all of them, and what its format's plots take of its settings (none by default).

The pipeline (evaluation/run.py) checks every selected evaluator first, then runs each and hands its rows to the
one store and renderer (evaluation/render.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from core.errors import PosGPTError
from evaluation.settings import settings_of

if TYPE_CHECKING:
    from data import TokenArray
    from evaluation.context import EvalContext
    from evaluation.store import RowFormat

EVALUATORS: dict[str, type[Evaluator]] = {}
RUN_KINDS = ("text", "task")


@dataclass(frozen=True)
class NoSettings:
    """The settings of an evaluator that reads no ``eval.*`` key."""


class Evaluator:
    """A plug-in evaluator (see the module's docstring for what a subclass declares)."""

    name: ClassVar[str] = ""
    runs: ClassVar[str] = "text"
    order: ClassVar[int] = 0
    Settings: ClassVar[type] = NoSettings
    recorded: ClassVar[tuple[str, ...]] = ()
    rows: ClassVar[RowFormat]

    def __init__(self, settings: Any) -> None:
        self.settings = settings

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if vars(cls).get("name"):
            if cls.runs not in RUN_KINDS:
                raise TypeError(f"evaluator {cls.name}: runs={cls.runs!r} is not one of {RUN_KINDS}")
            EVALUATORS[cls.name] = cls

    @classmethod
    def of(cls, section: Mapping[str, Any]) -> Evaluator:
        """The evaluator with its typed settings read from ``section`` (the evaluation's ``eval.*`` values)."""
        return cls(settings_of(cls.Settings, section))

    @classmethod
    def requested(cls, section: Mapping[str, Any]) -> bool:
        """Whether the ``eval.*`` settings ask for this evaluator (a run of its kind), absent ``eval.evaluators``."""
        return False

    def check(self, ctx: EvalContext) -> None:
        """PosGPTError for what this evaluator would refuse: run before any evaluator scores or writes."""

    def run(self, ctx: EvalContext, tokens: TokenArray | None) -> list[dict[str, Any]]:
        """The rows scored on ``ctx``'s model; ``tokens``: the scored split of a language-model run (None for a
        task run, whose evaluators generate their examples)."""
        raise NotImplementedError

    def header(self, ctx: EvalContext) -> dict[str, Any]:
        """The fields its results document records besides the run's (scheme, training length, step, config)."""
        return {}

    def finish(self, document: dict[str, Any]) -> dict[str, Any]:
        """The document with what is computed over all its rows, old and new (none by default)."""
        return document

    def plot_options(self) -> dict[str, Any]:
        """What its format's plots take of its settings (none by default)."""
        return {}

    def recorded_settings(self) -> dict[str, Any]:
        """The settings each row records (``recorded``), as their values."""
        return {name: getattr(self.settings, name) for name in self.recorded}


def select_evaluators(section: Mapping[str, Any], run_kind: str) -> list[Evaluator]:
    """The evaluators of an evaluation, with their settings: those of the run's kind that the ``eval.*`` settings
    ask for (:meth:`Evaluator.requested`), then those ``eval.evaluators`` adds; PosGPTError naming an unknown one,
    or one that scores the other kind of run."""
    registered()
    added = list(section.get("evaluators") or [])
    unknown = [name for name in added if name not in EVALUATORS]
    if unknown:
        raise PosGPTError(f"eval.evaluators names {unknown}, which no evaluator is; choose among {sorted(EVALUATORS)}")
    other = [name for name in added if EVALUATORS[name].runs != run_kind]
    if other:
        own = sorted(name for name, cls in EVALUATORS.items() if cls.runs == run_kind)
        raise PosGPTError(
            f"eval.evaluators names {other}, which score another kind of run than this {run_kind} run; this kind's "
            f"evaluators are {own}"
        )
    asked = [name for name, cls in EVALUATORS.items() if cls.runs == run_kind and cls.requested(section)]
    chosen = sorted(dict.fromkeys(asked + added), key=lambda name: (EVALUATORS[name].order, name))
    return [EVALUATORS[name].of(section) for name in chosen]


def registered() -> dict[str, type[Evaluator]]:
    """Every evaluator: the built-in ones (evaluation/evaluators/, imported here, not at import of this module, which
    they import) and any subclass defined elsewhere."""
    from evaluation import evaluators  # noqa: F401

    return EVALUATORS
