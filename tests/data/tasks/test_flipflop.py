"""Flip-flop (data/tasks/flipflop.py): each read returns the last write."""

from __future__ import annotations

import torch
from task_cases import gen

from data.tasks import build_task
from data.tasks.flipflop import BOS, READ, WRITE, ZERO, FlipFlopConfig


def test_flipflop_reads_return_the_last_write():
    task = build_task(FlipFlopConfig(p_write=0.2, p_read=0.3))
    for length in (40, 41):
        tokens, answer = task.generate(32, length, gen())
        for row, mask in zip(tokens, answer):
            offset = length % 2
            assert offset == 0 or row[0] == BOS
            ops, bits = row[offset::2], row[offset + 1 :: 2] - ZERO
            assert ops[0] == WRITE and ops[-1] == READ and set(bits.tolist()) <= {0, 1}
            last = None
            for op, bit in zip(ops.tolist(), bits.tolist()):
                if op == WRITE:
                    last = bit
                elif op == READ:
                    assert bit == last
            assert torch.equal(mask[offset + 1 :: 2], ops == READ) and not mask[offset::2].any()
