"""The passkey task (data/tasks/passkey.py): its format and the depth of the key."""

from __future__ import annotations

import pytest
import torch
from task_cases import gen

from core.errors import PosGPTError
from data.tasks import build_task
from data.tasks.passkey import PasskeyConfig


def test_passkey_format_and_depth():
    cfg = PasskeyConfig(key_len=3, n_symbols=10, filler_len=4)
    task = build_task(cfg)
    key_marker, query_marker = 14, 15
    for depth, key_at in ((0.0, 0), (1.0, 40 - 2 * 3 - 2), (0.5, 16)):
        tokens, answer = task.generate(5, 40, gen(), depth=depth)
        assert (tokens[:, key_at] == key_marker).all(), depth
        key = tokens[:, key_at + 1 : key_at + 4]
        assert (tokens[:, -4] == query_marker).all() and torch.equal(tokens[:, -3:], key)
        assert int(answer.sum()) == 5 * 3 and answer[:, -3:].all()
        filler = torch.cat((tokens[:, :key_at], tokens[:, key_at + 4 : -4]), dim=1)
        # the filler "sentence" repeats: filler token j is n_symbols + j mod filler_len
        assert torch.equal(filler, (10 + torch.arange(filler.shape[1]) % 4).expand_as(filler))
    tokens, _ = task.generate(200, 40, gen())
    depths = (tokens == key_marker).int().argmax(dim=1)
    assert len(set(depths.tolist())) > 10  # random depth in training
    with pytest.raises(PosGPTError, match="depth"):
        task.sample(1, 39, gen(), depth=1.5)
