"""scripts/estimate.py's memory and FLOP model (experiment/estimate.py): its counts agree with the built model,
its attention terms order the backends as they should, and on this machine its training and scoring
predictions are within 15% of the measured peak growth (evaluation/memory.py) for small configs."""

import json
import subprocess
import sys

import pytest
import torch
from cli_runs import REPO

from experiment.build import build_model, model_flops_per_token
from experiment.compose import compose_config
from experiment.estimate import MemoryEstimate, count_parameters, flops_per_token, scoring_memory, training_memory


@pytest.mark.parametrize("overrides", [[], ["pe=learned", "model=tiny"], ["pe=kerple", "model=gpt2"]])
def test_parameters_and_flops_are_the_built_models(overrides):
    cfg = compose_config(overrides)
    model = build_model(cfg)
    assert count_parameters(cfg) == model.num_params()
    assert flops_per_token(cfg) == model_flops_per_token(model, cfg.train.seq_len)


def test_scoring_memory_orders_the_backends():
    """math keeps T x T scores, the bias path one bounded mask block, flex and flash SDPA nothing T x T."""
    cfg = compose_config(["pe=alibi", "train.seq_len=1024"])
    math, sdpa, flex = (scoring_memory(cfg, 16384, b).parts["attention"] for b in ("math", "sdpa", "flex"))
    assert math > sdpa > flex == 0
    assert scoring_memory(compose_config(["pe=rope"]), 16384, "sdpa").parts["attention"] == 0


def test_scoring_memory_counts_the_largest_phase_not_the_sum():
    """A layer's attention, its MLP and the loss head run one after another: the peak is the largest of them."""
    estimate = MemoryEstimate({"weights": 10, "a": 5, "b": 7, "c": 1}, phases=(("a", "c"), ("b",)))
    assert estimate.total == 10 + 7
    cfg = compose_config(["pe=alibi", "train.seq_len=64"])
    parts = scoring_memory(cfg, 1024, "sdpa").parts
    phases = (parts["attention_layer"] + parts["attention"], parts["mlp_layer"], parts["loss_head"])
    assert scoring_memory(cfg, 1024, "sdpa").total == parts["weights"] + parts["residual"] + max(phases)


def test_training_memory_has_adamw_states_and_bf16_halves_activations():
    cfg = compose_config([])
    fp32, bf16 = training_memory(cfg, "cpu"), training_memory(cfg, "cuda", torch.bfloat16)
    assert fp32.parts["optimizer"] == 2 * fp32.parts["weights"] == 2 * fp32.parts["gradients"]
    assert bf16.parts["activations"] == fp32.parts["activations"] / 2


def test_a_per_layer_pattern_counts_each_layer_with_its_own_scheme():
    """pe=hybrid with ALiBi in one layer and RoPE in the other: training keeps ALiBi's mask in one layer and
    RoPE's rotated copies in the other (half of each pure model's activations); scoring peaks at the larger."""
    pure = {name: compose_config([f"pe={name}", "train.seq_len=512"]) for name in ("alibi", "rope")}
    mixed = compose_config(["pe=hybrid", "pe.pattern=[alibi,rope]", "train.seq_len=512"])
    activations = {name: training_memory(cfg).parts["activations"] for name, cfg in pure.items()}
    assert activations["alibi"] != activations["rope"]
    assert training_memory(mixed).parts["activations"] == (activations["alibi"] + activations["rope"]) / 2
    scoring = {name: scoring_memory(cfg, 4096, "sdpa").parts for name, cfg in pure.items()}
    layer = {name: parts["attention_layer"] + parts["attention"] for name, parts in scoring.items()}
    parts = scoring_memory(mixed, 4096, "sdpa").parts
    assert parts["attention_layer"] + parts["attention"] == max(layer.values())
    assert parts["attention"] == scoring["alibi"]["attention"] > 0  # the mask of its ALiBi layer dominates


def measured(*overrides: str) -> dict:
    """The estimate against a measured peak (scripts/estimate.py --measure: glibc returns freed blocks, so the
    peak is the live tensors', not what the allocator kept from earlier work)."""
    result = subprocess.run(
        [sys.executable, "scripts/estimate.py", "--measure", *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["measured"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        ["train.batch_size=8"],  # training, the default model
        ["pe=alibi", "model=tiny", "train.seq_len=256", "train.batch_size=8"],  # training, a bias scheme
        # scoring at 16x the default training length, the bias path; 4 rows a batch, not 16: the peak growth hardly
        # depends on them (328 against 340 MB measured, predicted/measured 0.97 and 1.01), the time halves
        ["pe=alibi", "--eval-length", "1024", "eval.batch_tokens=4096"],
    ],
    ids=["train-default", "train-alibi-256", "score-alibi-16x"],
)
@pytest.mark.e2e
def test_predicted_memory_is_within_15_percent_of_the_measured_peak(overrides):
    """bench/results/2026-11-24-cpu-2core-estimate.json: 0.92-1.07 on this CPU with 1 or 2 threads."""
    result = measured(*overrides)
    assert 0.85 <= result["predicted_over_measured"] <= 1.15, result
