"""Evaluation settings that name something the evaluation would not produce: refused at plan time, before any work.

experiment.config.validate checks each eval.* value on its own (positive, known names); these checks relate
them to each other and to the run's (its training length, its task). The planner runs them: train.py at its start
(so a run does not train for hours and then find its evaluation settings wrong), eval.py before it loads any data.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from core.errors import PosGPTError
from data.tasks import NO_TASK, build_task
from evaluation.context import evaluated_lengths
from evaluation.key_tokens import LONG_PROTOCOLS, check_evaluator_dir, key_jobs, short_length, short_stride


def check_eval_settings(cfg: DictConfig) -> None:
    """PosGPTError, naming the setting, when an eval.* setting asks for what the evaluation cannot produce."""
    e = cfg.eval
    lengths = evaluated_lengths(e.lengths, e.length_multipliers, cfg.train.seq_len)
    if e.stride is not None and "sliding" not in e.protocols:
        raise PosGPTError(
            f"eval.stride={e.stride} is the sliding protocol's stride, but eval.protocols={list(e.protocols)} "
            "has no sliding: add sliding or drop eval.stride"
        )
    if "streaming" in e.protocols and e.streaming_sinks >= min(lengths):
        raise PosGPTError(
            f"eval.streaming_sinks={e.streaming_sinks} leaves no window of recent tokens at length {min(lengths)} (the "
            "streaming cache holds the sinks and length - sinks recent tokens): lower it below every length"
        )
    too_long = [length for length in lengths if length > e.max_tokens] if cfg.task.name == NO_TASK else []
    if too_long:  # perplexity's targets (a task run generates its examples: no max_tokens)
        raise PosGPTError(
            f"evaluation lengths {too_long} exceed eval.max_tokens={e.max_tokens}, the targets every length is "
            "scored on: no window of them fits; raise eval.max_tokens or drop those lengths"
        )
    _check_tasks_fit(cfg, lengths)
    _check_random_positions(cfg, lengths)
    _check_key_tokens(cfg, lengths)
    not_evaluated = sorted(set(e.per_position_plot_lengths or []) - set(lengths))
    if not_evaluated:
        raise PosGPTError(
            f"eval.per_position_plot_lengths names {not_evaluated}, which are not evaluated (the lengths are "
            f"{lengths}): choose among them"
        )


def _check_tasks_fit(cfg: DictConfig, lengths: list[int]) -> None:
    """A task run's lengths must fit the task's format (a shorter one fails after training, with nothing scored);
    the copy probe needs a length longer than its span (its two copies), else it writes no row at all."""
    task = build_task(OmegaConf.to_object(cfg.task))
    if task is not None and min(lengths) + 1 < task.min_length():
        short = [length for length in lengths if length + 1 < task.min_length()]
        raise PosGPTError(
            f"evaluation lengths {short} (eval.lengths or eval.length_multipliers x train.seq_len) are shorter than "
            f"task={task.name} can fill with its settings ({task.min_length() - 1} tokens): drop them"
        )
    span = cfg.eval.copy_span
    if cfg.eval.tasks and span >= max(lengths):
        raise PosGPTError(
            f"eval.copy_span={span} is not shorter than any evaluation length (the longest is {max(lengths)}): the "
            "copy probe writes its span twice in a window, so it would score nothing; lower eval.copy_span"
        )


def _check_random_positions(cfg: DictConfig, lengths: list[int]) -> None:
    """eval.random_positions draws a task example's positions from the [0, N) its run trained on."""
    if not cfg.eval.random_positions:
        return
    n = cfg.train.random_positions
    if not n:  # a language-model run never gets here: the setting is a task run's (validate's run kinds)
        raise PosGPTError(
            f"eval.random_positions scores a task run at positions drawn from the [0, N) it trained on "
            f"(train.random_positions=N); this run has train.random_positions={n}: drop eval.random_positions"
        )
    longer = [length for length in lengths if length > n]
    if longer:
        raise PosGPTError(
            f"eval.random_positions draws each example's positions from [0, train.random_positions={n}): the lengths "
            f"{longer} do not fit; drop them (eval.lengths or eval.length_multipliers)"
        )


def _check_key_tokens(cfg: DictConfig, lengths: list[int]) -> None:
    """Key-token perplexity (evaluation/key_tokens.py) needs text, a protocol whose context is the tokens before each
    target, a length longer than its short context, and an evaluator that is a run; its evaluator is read only with
    it."""
    e = cfg.eval
    if not e.key_tokens:
        if e.key_evaluator is not None:
            raise PosGPTError(
                f"eval.key_evaluator={e.key_evaluator} is read only when eval.key_tokens=true: add it or drop "
                "eval.key_evaluator"
            )
        return
    if cfg.task.name != NO_TASK:
        raise PosGPTError(f"eval.key_tokens scores text; this run was trained on task={cfg.task.name}: drop it")
    if not set(e.protocols) & set(LONG_PROTOCOLS):
        raise PosGPTError(
            f"eval.key_tokens compares each target's context in the {' or '.join(LONG_PROTOCOLS)} protocol with a "
            f"short one; eval.protocols={list(e.protocols)} has neither: add one"
        )
    size = short_length(e.key_short_length, cfg.train.seq_len)
    stride = short_stride(e.key_short_stride, size)
    if not key_jobs(list(e.protocols), lengths, size):
        raise PosGPTError(
            f"eval.key_tokens=true needs an evaluation length longer than its short context of {size} tokens "
            f"(eval.key_short_length, default train.seq_len); the lengths are {lengths}: add a longer one or lower "
            "eval.key_short_length"
        )
    if stride > size:
        raise PosGPTError(
            f"eval.key_short_stride={stride} exceeds the short context of {size} tokens (eval.key_short_length): "
            f"each short window scores its last stride targets, so at most {size}"
        )
    if e.key_evaluator is not None:
        check_evaluator_dir(e.key_evaluator)
