"""What the commands' refusal tests share: a tree's digest (to show a refused command wrote nothing), the check that a
command is refused in one line and leaves the tree as it was, and the runs' settings they use."""

from __future__ import annotations

import os
from pathlib import Path

from cli_runs import assert_one_line_error

TINY_MQAR = ["task=mqar", "pe=rope", "model.n_layer=2", "train.seq_len=32"]  # mqar's 8 pairs need 32 tokens
INSPECT = ("inspect.windows=1", "inspect.length_multipliers=[1]")


def tree(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root`` by its relative name: a file's bytes, a folder as "folder", a link's target."""
    entries: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            entries[name] = f"link to {os.readlink(path)}"
        elif path.is_dir():
            entries[name] = "folder"
        else:
            entries[name] = path.read_bytes()
    return entries


def refused(cli, root: Path, command: tuple[str, ...], *fragments: str, code: int = 2) -> None:
    """``command`` answers one ``error:`` line holding ``fragments``, exits ``code``, prints nothing on stdout,
    and leaves ``root`` as it was."""
    before = tree(root)
    done = cli.here(*command)
    if code == 2:
        assert_one_line_error(done, *fragments)
    else:
        lines = done.stderr.strip().splitlines()
        assert done.returncode == code and len(lines) == 1 and lines[0].startswith("error: "), done.stderr
        assert all(fragment in lines[0] for fragment in fragments), done.stderr
    assert done.stdout == "", done.stdout
    assert tree(root) == before
