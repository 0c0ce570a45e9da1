"""scripts/compare.py on real runs: two tiny schemes trained through train.py, one re-evaluated by eval.py."""

import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from core.checkpoint import load_checkpoint
from core.errors import PosGPTError
from experiment.settings import config_for_evaluation

REPO = Path(__file__).resolve().parents[1]
TINY = ["data=text", "data.val_fraction=0.2", "model.n_layer=1", "model.n_embd=32", "model.n_head=2",
        "train.seq_len=16", "train.batch_size=4", "train.max_steps=6", "train.val_batches=2", "train.num_threads=1",
        "logging.wandb.mode=disabled", "logging.progress=false", "eval.max_tokens=256"]


def load_compare():
    spec = importlib.util.spec_from_file_location("compare", REPO / "scripts" / "compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


compare = load_compare()


def run(*args, cache):
    result = subprocess.run([sys.executable, *map(str, args)], cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "POSGPT_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A rope and a learned run, trained in one multirun sweep; the rope run also evaluated with YaRN."""
    tmp = tmp_path_factory.mktemp("study")
    corpus, sweep = tmp / "corpus.txt", tmp / "sweep"
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    corpus.write_text("\n".join((stdlib / name).read_text() for name in ("textwrap.py", "string.py", "bisect.py")))
    run("train.py", "-m", "pe=rope,learned", f"hydra.sweep.dir={sweep}", f"data.files=[{corpus}]", *TINY,
        cache=tmp / "cache")
    rope, learned = sweep / "0-rope", sweep / "1-learned"
    run("eval.py", f"run_dir={rope}", "eval.scalings=[yarn:4]", "eval.protocols=[nonoverlapping]", cache=tmp / "cache")
    return tmp, rope, learned


def test_eval_py_adds_scaling_rows_to_the_training_eval(runs):
    _, rope, _ = runs
    document = json.loads((rope / "eval" / "extrapolation.json").read_text())
    settings = {(r["protocol"], r["scaling"]["type"]) for r in document["results"]}
    assert settings == {("nonoverlapping", "none"), ("sliding", "none"), ("nonoverlapping", "yarn")}
    assert document["step"] == 6 and len(document["results"]) == 4 * 3


def test_compare_writes_one_table_and_one_plot(runs):
    tmp, rope, learned = runs
    md, png = tmp / "out" / "table.md", tmp / "out" / "plot.png"
    compare.main([str(rope), str(learned), "--markdown", str(md), "--plot", str(png),
                  "--per-position", str(tmp / "pp.png")])
    table = md.read_text()
    assert "| scheme | 16 (1×) | 32 (2×) | 64 (4×) | 128 (8×) |" in table
    lines = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("| ")}
    assert {"rope", "rope yarn:4", "learned"} <= lines.keys()
    assert lines["learned"].count("n/a") == 3  # learned cannot encode beyond its 16 positions
    assert "every cell scores the same 256 tokens" in table
    for path in (png, tmp / "pp.png"):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_sliding_protocol_and_errors(runs, capsys):
    tmp, rope, learned = runs
    md = tmp / "sliding.md"
    compare.main([str(rope), str(learned), "--protocol", "sliding", "--markdown", str(md),
                  "--plot", str(tmp / "s.png")])
    assert "sliding protocol, stride L/2" in md.read_text() and "yarn" not in md.read_text()
    with pytest.raises(SystemExit) as exit_info:
        compare.main([str(tmp), "--markdown", str(tmp / "x.md")])
    assert exit_info.value.code == 2 and "no eval/extrapolation.json" in capsys.readouterr().err


def test_eval_py_rejects_a_scaling_for_a_scheme_without_one(runs):
    _, _, learned = runs
    checkpoint = load_checkpoint(learned)
    with pytest.raises(PosGPTError, match="pe.scaling.type"):
        config_for_evaluation(checkpoint, ["pe.scaling.type=yarn"])
