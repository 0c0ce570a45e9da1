"""Each eval.* settings type validates the settings it declares (evaluation/settings.py, its ``check``), and the
planner runs every check of the eval section's types, each declaring type once: the cases of the first tests are
generated from the types of experiment/config.py's EVAL_STAGES; the refusals below are those no other test drives."""

import dataclasses
from dataclasses import dataclass

import pytest
from result_runs import eval_config

from core.errors import PosGPTError
from core.settings import declared_checks
from data.tasks import build_task
from data.tasks.passkey import PasskeyConfig
from evaluation.context import EvaluationPlan
from evaluation.settings import check_settings
from experiment.config import EVAL_STAGES, EvalConfig
from experiment.eval_checks import check_eval_settings

DECLARING = sorted(
    {kind for stage in EVAL_STAGES for kind in stage.__mro__ if "check" in vars(kind)}, key=lambda kind: kind.__name__
)
PASSKEY_MIN = build_task(PasskeyConfig()).min_length() - 1  # the shortest passkey evaluation length


def plan(lengths=(8, 16), task=None, random_positions=None) -> EvaluationPlan:
    return EvaluationPlan(
        step=1,
        lengths=lengths,
        scheme="rope",
        train_len=8,
        train_seed=0,
        task=task,
        train_random_positions=random_positions,
    )


def section(**eval_keys) -> dict:
    return {**dataclasses.asdict(EvalConfig()), **eval_keys}


def test_the_eval_section_has_checks_to_run():
    assert len(DECLARING) > 3


@pytest.mark.parametrize("kind", DECLARING, ids=[kind.__name__ for kind in DECLARING])
def test_every_check_an_eval_settings_type_declares_is_run_once_by_the_planner(kind, monkeypatch):
    calls = []
    for declaring in DECLARING:
        monkeypatch.setattr(declaring, "check", lambda self, plan, declaring=declaring: calls.append(declaring))
    check_eval_settings(eval_config())
    assert calls.count(kind) == 1 and calls == declared_checks(EVAL_STAGES)


def test_a_shared_types_check_runs_once_before_those_of_the_types_that_inherit_it():
    calls = []

    @dataclass(frozen=True, kw_only=True)
    class Shared:
        a: int = 0

        def check(self, plan: EvaluationPlan) -> None:
            calls.append(("Shared", type(self).__name__, self.a))

    @dataclass(frozen=True, kw_only=True)
    class One(Shared):
        b: int = 0

        def check(self, plan: EvaluationPlan) -> None:
            calls.append(("One", type(self).__name__, self.b))

    @dataclass(frozen=True, kw_only=True)
    class Two(Shared):
        c: int = 0

    check_settings([One, Two], {"a": 1, "b": 2, "c": 3}, plan())
    assert calls == [("Shared", "One", 1), ("One", "One", 2)]


@pytest.mark.parametrize(
    "eval_keys, planned, message",
    [
        (
            {"protocols": ["streaming"], "streaming_sinks": 8},
            {},
            "eval.streaming_sinks=8 leaves no window of recent tokens at length 8",
        ),
        (
            {"tasks": ["copy_probe"], "copy_span": 16},
            {},
            "eval.copy_span=16 is not shorter than any evaluation length (the longest is 16)",
        ),
        (
            {},
            {"lengths": (PASSKEY_MIN - 1, 256), "task": PasskeyConfig()},
            f"evaluation lengths [{PASSKEY_MIN - 1}] (eval.lengths or eval.length_multipliers x train.seq_len) are "
            "shorter than task=passkey",
        ),
        (
            {"random_positions": True},
            {"lengths": (256,), "task": PasskeyConfig()},
            "this run has train.random_positions=None: drop eval.random_positions",
        ),
        (
            {"random_positions": True},
            {"lengths": (256, 512), "task": PasskeyConfig(), "random_positions": 256},
            "[0, train.random_positions=256): the lengths [512] do not fit",
        ),
        (
            {"key_tokens": True},
            {"lengths": (256,), "task": PasskeyConfig()},
            "eval.key_tokens scores text; this run was trained on task=passkey: drop it",
        ),
    ],
)
def test_a_settings_types_check_refuses_what_the_evaluation_cannot_produce(eval_keys, planned, message):
    with pytest.raises(PosGPTError) as refused:
        check_settings(EVAL_STAGES, section(**eval_keys), plan(**planned))
    assert message in str(refused.value)


def test_a_task_run_is_not_held_to_the_token_budget_of_a_language_model_run():
    check_settings(EVAL_STAGES, section(max_tokens=8), plan(lengths=(256,), task=PasskeyConfig()))
    with pytest.raises(PosGPTError, match="exceed eval.max_tokens=8"):
        check_settings(EVAL_STAGES, section(max_tokens=8), plan(lengths=(256,)))
