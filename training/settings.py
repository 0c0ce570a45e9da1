"""The ``train.*`` settings: each declared once, in the settings type of the stage of training that reads it.

A stage's settings type (``LoopSettings``, ``OptimizerSettings``, ``CheckpointSettings``, ``MetricsSettings``,
``InitFromSettings``) is a frozen dataclass. Its fields with a default are the ``train.*`` settings the stage reads,
each declared there with its default, its domain and readers (core.domain's ``domain``, ``choice``, ``read_with``) and
its comment; its fields without one are what the planner hands it from other sections or works out
(experiment/plan.py, ``PASSED_IN``). A setting several stages read is declared once, in a small type they all inherit
(:class:`RunLength`: ``train.max_steps``).

The schema's ``train`` section (experiment/config.py, ``TrainConfig``) is made from those declarations by
core.settings' ``schema_section``: a plain dataclass, not a frozen one, since OmegaConf makes a frozen dataclass's
config read-only and Hydra merges the config files and the command line into the schema. The planner fills each stage's
frozen settings from the composed section by field name (experiment/plan.py, ``section_settings``).

A type validates what it declares: one whose own body defines ``check(self)`` raises there, naming the setting, when
its settings cannot train together (``LoopSettings``: train.compile's word, train.random_positions and PoSE's settings;
``OptimizerSettings``: train.lr x train.weight_decay; ``InitFromSettings``: train.init_from_pe=replace without a
parent). A check reads only the settings its type declares (core.settings' ``declared_part``: the planner checks the
section before it works out what it passes in); what it needs besides is passed to it explicitly (PoSE's settings,
data/windows.py, are given train.seq_len). The planner runs every such check of the train section's types, each
declaring type once, after the settings' domains (experiment/config.py, ``validate``: core.settings'
``check_declared_settings``); what relates a train.* setting to another section's is that section's type's, given
the setting (data/config.py's ``DataConfig.check_training``: ``data.document_aware`` with the setting that draws a
window's positions; the learned scheme's ``check_model``: its table as long as train.seq_len).
"""

from __future__ import annotations

import dataclasses

from core.domain import BENCHMARKS, COMMANDS, domain

EVERY_COMMAND = tuple(COMMANDS)  # a setting every command reads (core.domain's commands)
# A setting the benchmarks read too (scripts/speed.py times a training step, scripts/estimate.py predicts and measures
# its memory): the step's shape and its optimizer and schedule. The train section's other settings only train.py reads.
BENCHMARKED = ("train", *BENCHMARKS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunLength:
    """How long a run trains: the loop stops at ``train.max_steps``, the learning-rate schedule decays until it and
    the metrics' progress bar counts up to it."""

    max_steps: int = domain(1200, ge=1, commands=BENCHMARKED)  # optimizer steps
