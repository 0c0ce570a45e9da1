"""Variable tracking (data/tasks/vartrack.py): every variable that holds the queried value."""

from __future__ import annotations

from task_cases import _starts, gen

from data.tasks import build_task
from data.tasks.vartrack import VarTrackConfig


def test_vartrack_lists_every_variable_that_holds_the_queried_value():
    cfg = VarTrackConfig(n_chains=3, n_hops=2, n_symbols=5, n_var_symbols=12, filler_len=2)
    task = build_task(cfg)
    let, query = 5 + 12 + 2, 5 + 12 + 2 + 1
    for length in (task.min_length(), 80):
        tokens, answer = task.generate(32, length, gen(1))
        for row, mask in zip(tokens.tolist(), answer.tolist()):
            assert row[-5] == query and sum(mask) == 3 and all(mask[-3:])
            statements = [(row[i + 1], row[i + 2]) for i in _starts(row[:-5], let)]
            assert len(statements) == 9 and len({target for target, _ in statements}) == 9
            holds, value = [], row[-4]  # follow the assignments in order: who holds the value
            for target, source in statements:
                if source == value or source in holds:
                    holds.append(target)
            assert row[-3:] == holds
