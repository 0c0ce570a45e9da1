"""Where does an MQAR run's second layer look from a query? Its attention on the queried pair's value.

MQAR (data/tasks/mqar.py) writes the pairs k_1 v_1 .. k_N v_N at positions 0 .. 2N - 1; a query k_i later asks
for v_i. A recall head attends from the query to v_i's position in the context (the value, whose first layer has
seen its key). For each run, on 64 held-out examples at each length, this prints, for the layer-1 head that puts
the most attention there (with --every-layer: the head of each layer that does), its mean attention weight on v_i's
position over every query, and over the queries farther than the training length (64) from it and those nearer.

    python results/task-study/attention_on_value.py <task-study run dir> ...   # runs with their checkpoints
    python results/task-study/attention_on_value.py --every-layer <run dir> ...   # a deeper model's every layer

Used for docs/results.md (the hybrid's MQAR); the checkpoints are not committed, so it runs on the study's run
directories (multirun/task-study/mqar-<scheme>-s<seed>). Its output there is attention_on_value.txt.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from data.tasks import build_task, held_out_seed  # noqa: E402
from experiment.build import load_trained_run  # noqa: E402

LENGTHS = (64, 1024)
EXAMPLES = 64
FAR = 64  # the training length: queries farther than this from their value are past it


def attention_on_value(run_dir: Path, every_layer: bool = False) -> list[str]:
    run = load_trained_run(run_dir, [])
    task = build_task(OmegaConf.to_object(run.cfg.task))
    generator = torch.Generator().manual_seed(held_out_seed(7, "attention on value"))
    lines = []
    for length in LENGTHS:
        inputs, targets = task.sample(EXAMPLES, length, generator)
        probs: list[torch.Tensor] = []  # per layer, (batch, head, query, key)
        run.model.hidden_states(inputs, capture=probs)
        example, query = (targets != -100).nonzero(as_tuple=True)  # each query: its input is k_i, its target v_i
        context_keys = inputs[:, : 2 * task.cfg.n_pairs : 2]
        pair = (context_keys[example] == inputs[example, query][:, None]).float().argmax(1)
        value_at = 2 * pair + 1
        far = (query - value_at) > FAR
        for layer in range(len(probs)) if every_layer else [1]:
            on_value = probs[layer][example, :, query, value_at]  # (queries, heads)
            head = int(on_value.mean(0).argmax())
            weight = on_value[:, head]
            line = f"{run_dir.name} length {length}: layer {layer} head {head}: all {weight.mean():.3f}"
            if far.any():
                near = weight[~far].mean()
                line += f"; far (> {FAR}, {int(far.sum())} queries) {weight[far].mean():.3f}, near {near:.3f}"
            lines.append(line)
    return lines


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    every_layer = sys.argv[1:2] == ["--every-layer"]
    for argument in sys.argv[1 + every_layer :]:
        print("\n".join(attention_on_value(Path(argument), every_layer)), flush=True)
