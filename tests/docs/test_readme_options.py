"""Every documented value of every option works as a user types it: the key tables of docs/configuration.md are
parsed, and each default and each listed choice (`a` | `b`) is composed through Hydra and validated, as train.py
would."""

import re

import pytest
from repo_root import REPO

from core.errors import PosGPTError
from experiment.compose import compose_config
from experiment.config import validate

CONFIGURATION = REPO / "docs" / "configuration.md"
_CODE = re.compile(r"`([^`]+)`")


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def documented_values() -> list[tuple[str, str]]:
    """(override prefix, value) for each key of the "## Keys" tables of docs/configuration.md: its default, and
    each choice the meaning column lists as `a` \\| `b` (they belong to the row's first key). The pe.* table's
    first column names the scheme; its rows are composed at 4 layers, since a per-layer preset (rnope) is refused
    on a model with fewer layers than its pattern."""
    text = CONFIGURATION.read_text().split("\n## Keys\n", 1)[1].split("\n## ", 1)[0]
    values, section = [], None
    for line in text.splitlines():
        heading = re.fullmatch(r"`(\w+)\.\*`.*", line.strip())
        if heading:
            section = heading.group(1)
            continue
        if not line.startswith("|") or set(line) <= set("|- ") or line.startswith(("| key", "| scheme")):
            continue
        cells = _cells(line.replace("\\|", "\x00"))
        scheme = cells.pop(0) if section == "pe" else None
        keys = _CODE.findall(cells[0])
        defaults = [cells[1]] if len(keys) == 1 else [d.strip() for d in cells[1].split(",")]
        prefix = [f"pe={scheme}", "model.n_layer=4"] if scheme else []
        for key, default in zip(keys, defaults):
            if default:
                values.append((prefix, f"{section}.{key}={default}"))
        choices = cells[2].split("\x00")
        if len(choices) > 1:
            values += [(prefix, f"{section}.{keys[0]}={_CODE.search(c).group(1)}") for c in choices]
    return values


def test_the_key_tables_are_found():
    overrides = [override for _, override in documented_values()]
    assert "train.compile=true" in overrides and "train.compile=false" in overrides
    assert "pe.scaling.type=yarn" in overrides and "logging.wandb.mode=disabled" in overrides
    assert "model.attn_backend=flex" in overrides
    assert len(overrides) > 50


def accepted(overrides: list[str]) -> bool:
    try:
        validate(compose_config(overrides))
    except PosGPTError:
        return False
    return True


@pytest.mark.slow
def test_every_documented_value_is_accepted_as_typed():
    """Composed in batches of distinct keys (a compose takes a while); a failing batch is retried value by value
    so that the message names the culprit."""
    batches: dict[tuple, list[list[str]]] = {}
    for prefix, override in documented_values():
        key = override.split("=", 1)[0]
        rounds = batches.setdefault(tuple(prefix), [])
        free = next((batch for batch in rounds if all(o.split("=", 1)[0] != key for o in batch)), None)
        if free is None:
            rounds.append(free := [])
        free.append(override)
    refused = []
    for prefix, rounds in batches.items():
        for batch in rounds:
            if not accepted([*prefix, *batch]):
                refused += [" ".join([*prefix, o]) for o in batch if not accepted([*prefix, o])]
    assert refused == []


def test_an_undocumented_value_is_refused():
    with pytest.raises(PosGPTError, match="train.compile must be auto, true or false"):
        validate(compose_config(["train.compile=maybe"]))
