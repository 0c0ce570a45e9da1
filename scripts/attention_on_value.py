"""Where does an MQAR run's recall head look from a query? Its attention on the queried pair's value.

MQAR (data/tasks/mqar.py) writes the pairs k_1 v_1 .. k_N v_N at positions 0 .. 2N - 1; a query k_i later asks
for v_i. A recall head attends from the query to v_i's position in the context (the value, whose first layer has
seen its key). For each run, on 64 held-out examples at 1x and 16x its training length L, this prints, for the
layer-1 head that puts the most attention there (with --every-layer: the head of each layer that does), its mean
attention weight on v_i's position over every query, and over the queries farther than L from it and those nearer.

    python scripts/attention_on_value.py multirun/task-study/mqar-hybrid-s1 ...     # runs with their checkpoints
    python scripts/attention_on_value.py --every-layer multirun/task-4layer/mqar-rope-s2   # every layer's head

The MQAR analyses in docs/results.md quote its output (results/task-study/attention_on_value.txt,
results/task-4layer-hybrids/attention_on_value.txt); checkpoints are not committed, so it runs on a study's run
directories. Every run is loaded and checked (an MQAR run, with the layer read) before the first line is printed,
so a refused command prints nothing but its error; it writes no file.
"""

from __future__ import annotations

import _repo

import argparse
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from core.cli import ArgumentParser, exit_on_user_error
from core.errors import PosGPTError
from data.tasks import build_task, held_out_seed
from experiment.build import TrainedRun, load_trained_run

EXAMPLES = 64
MULTIPLES = (1, 16)  # of the training length: the lengths scored
RECALL_LAYER = 1  # a 2-layer model's recall head is in its second layer


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path, help="MQAR run directories (with their checkpoints)")
    parser.add_argument("--every-layer", action="store_true", help="the head of each layer, not only layer 1's")
    return parser.parse_args(argv)


def value_positions(inputs: torch.Tensor, targets: torch.Tensor, n_pairs: int) -> tuple[torch.Tensor, ...]:
    """Each query of a batch of MQAR examples: (its example, its position, the position of the value it asks for).
    A query's input is k_i and its target v_i; k_i is found among the context's keys (even positions < 2N)."""
    example, query = (targets != -100).nonzero(as_tuple=True)
    context_keys = inputs[:, : 2 * n_pairs : 2]
    pair = (context_keys[example] == inputs[example, query][:, None]).float().argmax(1)
    return example, query, 2 * pair + 1


def load_mqar_run(run_dir: Path, every_layer: bool = False) -> TrainedRun:
    """The run, once checked to be one this reads: an MQAR run with a layer RECALL_LAYER (unless ``every_layer``)."""
    run = load_trained_run(run_dir, [], "scripts/attention_on_value.py")
    if run.cfg.task.name != "mqar":
        raise PosGPTError(f"{run_dir} is not an MQAR run (task={run.cfg.task.name}): this reads MQAR's layout")
    layers = run.cfg.model.n_layer
    if not every_layer and layers <= RECALL_LAYER:
        raise PosGPTError(f"{run_dir} has {layers} layer(s), no layer {RECALL_LAYER}: pass --every-layer")
    return run


def attention_on_value(run_dir: Path, every_layer: bool = False, run: TrainedRun | None = None) -> list[str]:
    """One line per scored length and layer: the head with the most attention on the queried value, its mean
    weight there over all queries, and (where some are) over the queries farther than L from their value and nearer.
    ``run``: the run at ``run_dir`` loaded already (load_mqar_run), else it is loaded here."""
    run = load_mqar_run(run_dir, every_layer) if run is None else run
    task = build_task(OmegaConf.to_object(run.cfg.task))
    far_from = run.cfg.train.seq_len  # queries farther than the training length from their value are past it
    generator = torch.Generator().manual_seed(held_out_seed(7, "attention on value"))
    lines = []
    for length in (multiple * far_from for multiple in MULTIPLES):
        inputs, targets = task.sample(EXAMPLES, length, generator)
        probs: list[torch.Tensor] = []  # per layer, (batch, head, query, key)
        run.model.hidden_states(inputs.to(run.device), capture=probs)
        example, query, value_at = (t.to(run.device) for t in value_positions(inputs, targets, task.cfg.n_pairs))
        far = (query - value_at) > far_from
        for layer in range(len(probs)) if every_layer else [RECALL_LAYER]:
            on_value = probs[layer][example, :, query, value_at]  # (queries, heads)
            head = int(on_value.mean(0).argmax())
            weight = on_value[:, head]
            line = f"{run_dir.name} length {length}: layer {layer} head {head}: all {weight.mean():.3f}"
            if far.any():
                near = weight[~far].mean()
                line += f"; far (> {far_from}, {int(far.sum())} queries) {weight[far].mean():.3f}, near {near:.3f}"
            lines.append(line)
    return lines


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_grad_enabled(False)
    runs = [load_mqar_run(run_dir, args.every_layer) for run_dir in args.run_dirs]  # each refused before any line
    for run_dir, run in zip(args.run_dirs, runs):
        print("\n".join(attention_on_value(run_dir, args.every_layer, run)), flush=True)


if __name__ == "__main__":
    main()
