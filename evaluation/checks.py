"""Evaluation settings that name something the evaluation would not produce: refused before any work.

experiment.config.validate checks each eval.* value on its own (positive, known names); these checks relate
them to each other. train.py runs them at its start (so a run does not train for hours and then find its
evaluation settings wrong) and eval.py before it loads any data.
"""

from __future__ import annotations

from omegaconf import DictConfig

from core.errors import PosGPTError
from experiment.config import eval_lengths


def check_eval_settings(cfg: DictConfig) -> None:
    """PosGPTError, naming the setting, when an eval.* setting asks for what the evaluation cannot produce."""
    e = cfg.eval
    lengths = eval_lengths(cfg)
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
    too_long = [length for length in lengths if length > e.max_tokens]
    if too_long:
        raise PosGPTError(
            f"evaluation lengths {too_long} exceed eval.max_tokens={e.max_tokens}, the targets every length is "
            "scored on: no window of them fits; raise eval.max_tokens or drop those lengths"
        )
    not_evaluated = sorted(set(e.per_position_plot_lengths or []) - set(lengths))
    if not_evaluated:
        raise PosGPTError(
            f"eval.per_position_plot_lengths names {not_evaluated}, which are not evaluated (the lengths are "
            f"{lengths}): choose among them"
        )
