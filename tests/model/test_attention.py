"""Each layer's attention path is resolved once, when the model is built (model/attention.py, ``AttentionPath``),
and schemes declare capabilities instead of flags (model/pe/capabilities.py). Neither changed a number: the logits
and every parameter's gradient of every shipped scheme, on every path it takes on the CPU
(tests/support/attention_paths.py),
are bit for bit those of the commit before that change, run here on this machine from its own tree. (Schemes shipped
since have no earlier numbers to equal: the comparison covers the cases the earlier tree has.)"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from repo_root import REPO

ROOT = REPO
# The last commit whose model read capability flags in its forward pass.
BEFORE = "fa41895ba7d89607a9bbd8353b6a63caa7929787"

pytestmark = pytest.mark.slow


def before_tree(tmp_path: Path) -> Path:
    """The source tree of ``BEFORE``, extracted with git archive; skips where there is no such commit to read."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the earlier commit cannot be read")
    known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{BEFORE}^{{commit}}"], capture_output=True)
    if known.returncode:
        pytest.skip(f"commit {BEFORE[:12]} is not in this checkout (a shallow clone?)")
    tree = tmp_path / "before"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def paths_of(tree: Path, out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    script = ROOT / "tests" / "support" / "attention_paths.py"
    subprocess.run([sys.executable, str(script), str(tree), str(out)], cwd=tree, check=True, env=env, timeout=600)
    return torch.load(out)


def test_every_path_of_every_scheme_is_bit_identical_to_the_flagged_model(tmp_path):
    before = paths_of(before_tree(tmp_path), tmp_path / "before.pt")
    now = paths_of(ROOT, tmp_path / "now.pt")
    assert set(before) <= set(now)
    assert sum("error" not in case for case in now.values()) > 300  # the cases ran, not only their refusals
    for key in before:
        case = now[key]
        assert sorted(case) == sorted(before[key]), key
        for name, value in case.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, before[key][name]), f"{key}: {name}"
            else:
                assert value == before[key][name], f"{key}: {name}"
