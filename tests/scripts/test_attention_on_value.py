"""scripts/attention_on_value.py finds, for each MQAR query, the position of the value it asks for, and reads a
run's attention there (docs/results.md quotes its output on the task study's runs)."""

import attention_on_value
import pytest
import torch
from omegaconf import OmegaConf
from tiny_checkpoint import make_run

from data.tasks import build_task
from experiment.compose import compose_config

TINY_MQAR = ["task=mqar", "pe=rope", "model.n_layer=2", "train.seq_len=32"]  # mqar's 8 pairs need 32 tokens


def test_each_querys_value_position_holds_its_answer():
    task = build_task(OmegaConf.to_object(compose_config(["task=mqar"]).task))
    inputs, targets = task.sample(16, 256, torch.Generator().manual_seed(0))
    example, query, value_at = attention_on_value.value_positions(inputs, targets, task.cfg.n_pairs)
    assert len(query) == 16 * task.cfg.n_pairs  # every key queried once
    assert torch.equal(inputs[example, value_at], targets[example, query])  # the context's v_i is the answer
    assert torch.equal(inputs[example, value_at - 1], inputs[example, query])  # ... right after k_i, the query
    assert bool((value_at < 2 * task.cfg.n_pairs).all() and (query > value_at).all())


@pytest.mark.slow  # runs a command on a trained run
def test_a_run_gets_a_line_per_length_and_layer_the_same_on_every_call(cli, tmp_path, capsys):
    run_dir = make_run(tmp_path / "mqar-rope-s1", cli.corpus, *TINY_MQAR)
    attention_on_value.main([str(run_dir)])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["mqar-rope-s1 length 32", "mqar-rope-s1 length 512"]
    assert all(" layer 1 head " in line for line in lines)
    assert "far (> 32, " in lines[1] and "far" not in lines[0]  # at 1x no query is farther than L from its value
    assert lines == attention_on_value.attention_on_value(run_dir)  # the held-out examples are drawn alike
    attention_on_value.main(["--every-layer", str(run_dir)])
    layers = [line.split(": ")[1].split(" head")[0] for line in capsys.readouterr().out.splitlines()]
    assert layers == ["layer 0", "layer 1"] * 2  # each layer's head, at each length


def test_a_language_model_run_is_refused(cli, tmp_path, capsys):
    run_dir = make_run(tmp_path / "rope-s1", cli.corpus, "pe=rope")
    with pytest.raises(SystemExit) as exit_info:
        attention_on_value.main([str(run_dir)])
    assert exit_info.value.code == 2 and "is not an MQAR run (task=none)" in capsys.readouterr().err
