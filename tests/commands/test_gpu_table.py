"""bench/gpu_table.sh without a GPU: the shell parses, a wrong --part is refused before anything runs, and its Python
(the tests' record, the table) runs on a results file as the parts leave it. A GPU's time is scarce: a mistake here
would cost a run."""

import json
import re
import subprocess
import sys

import pytest
from cli_runs import REPO

SCRIPT = REPO / "bench" / "gpu_table.sh"


def heredocs() -> list[str]:
    return re.findall(r"<<'PY'\n(.*?)\nPY\n", SCRIPT.read_text(), flags=re.S)


def test_the_script_parses_and_refuses_a_wrong_part(tmp_path):
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    for args in (["--part", "6"], ["--part", "1,6"], ["--part"], ["--steps"], ["--budget", "0"], ["--budget", "9m"]):
        result = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), *args], capture_output=True, text=True)
        assert result.returncode == 2 and result.stderr.startswith("usage: bash bench/gpu_table.sh OUT_DIR [--part")


def test_the_schemes_measured_again_are_those_whose_latest_record_did_not_get_flex(tmp_path):
    retry = heredocs()[1]
    results = tmp_path / "runs.json"
    config = {"compile": True, "attn_backend": "flex"}
    earlier = [  # part 1: KERPLE without FlexAttention, T5 on it
        {"pe": "kerple", "tokens_per_s": 1.0, "config": {"compile": False, "attn_backend": "sdpa"}},
        {"pe": "t5", "tokens_per_s": 1.0, "config": config},
    ]
    output = [  # part 2: KERPLE with other kernel options got it; T5 failed; ALiBi (a compile that fell back)
        {"pe": "rope", "tokens_per_s": 1.0, "config": config | {"attn_backend": "sdpa"}},
        {"pe": "kerple", "tokens_per_s": 1.0, "config": config},
        {"pe": "t5", "error": "RuntimeError: out of resource"},
        {"pe": "alibi", "tokens_per_s": 1.0, "config": {"compile": False, "attn_backend": "sdpa"}},
    ]
    runs = [{"command": "...", "output": rows} for rows in ([], earlier, output)]
    results.write_text(json.dumps({"runs": runs}))
    run = subprocess.run(
        [sys.executable, "-", str(results), "alibi,fire,kerple,t5"], input=retry, capture_output=True, text=True
    )
    assert run.returncode == 0 and run.stdout == "alibi,t5\n", run.stderr


@pytest.mark.slow
def test_tests_stopped_at_their_time_limit_are_recorded_by_their_progress(tmp_path):
    record = heredocs()[0]
    results, log = tmp_path / "2026-01-01-GPU.json", tmp_path / "tests.txt"
    log.write_text("bringing up nodes...\n\n" + "." * 72 + " [ 31%]\n" + "." * 70 + "F. [ 62%]\n..s.\n")
    args = [sys.executable, "-", str(results), "124", str(log), "tests/model/test_kernels_backends.py"]
    run = subprocess.run(args, input=record, cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    (row,) = json.loads(results.read_text())["runs"][0]["output"]
    assert row == {
        "exit_status": 124,
        "summary": "stopped (exit 124) before its end: 146 passed, 1 failed, 0 error, 1 skipped",
        "passed": 146,
        "failed": 1,
        "error": 0,
        "skipped": 1,
    }


def test_the_tests_record_and_the_table(tmp_path):
    record, _, table = heredocs()
    results, log = tmp_path / "2026-01-01-GPU.json", tmp_path / "tests.txt"
    log.write_text("....\n2 failed, 40 passed, 3 skipped in 9.00s\n")
    run = subprocess.run(
        [sys.executable, "-", str(results), "1", str(log), "tests/model/test_kernels_backends.py"],
        input=record,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    runs = json.loads(results.read_text())["runs"]
    assert runs[0]["output"] == [
        {
            "exit_status": 1,
            "summary": "2 failed, 40 passed, 3 skipped in 9.00s",
            "failed": 2,
            "passed": 40,
            "skipped": 3,
        }
    ]
    config = {"compile": True, "attn_backend": "flex", "fused_ce": False, "flex_kernel_options": {}}
    runs.append(  # a command with RoPE, then one without it (other kernel options), as part 1 records them
        {
            "command": "python scripts/speed.py pe=rope,alibi,t5",
            "output": [
                {"pe": "rope", "tokens_per_s": 400e3, "peak_memory_mb": 1000, "config": config},
                {"pe": "alibi", "tokens_per_s": 440e3, "peak_memory_mb": 1100, "config": config},
                {"pe": "t5", "error": "RuntimeError: out of resource"},
            ],
        }
    )
    options = config | {"flex_kernel_options": {"bwd_num_stages": 2}}
    runs.append(
        {"command": "...", "output": [{"pe": "t5", "tokens_per_s": 360e3, "peak_memory_mb": 1300, "config": options}]}
    )
    cudnn = config | {"attn_backend": "sdpa", "sdpa_backend": "cudnn"}
    runs.append({"command": "...", "output": [{"pe": "rope", "tokens_per_s": 500e3, "config": cudnn}]})
    results.write_text(json.dumps({"runs": runs}))
    run = subprocess.run([sys.executable, "-", str(results), "rope"], input=table, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "CUDA tests: 2 failed, 40 passed, 3 skipped in 9.00s" in lines
    assert "| alibi | True | flex | False | 440k | 1.10x |  | 1.1 | 1.10x |  |  |  |  |" in lines
    assert any(line.startswith("| t5 | | error: RuntimeError: out of resource |") for line in lines)
    assert "| t5 | True | flex bwd_num_stages=2 | False | 360k | 0.90x |  | 1.3 | 1.30x |  |  |  |  |" in lines
    assert "| rope | True | sdpa cudnn | False | 500k | 1.00x |  |  |  |  |  |  |  |" in lines
    header = next(line for line in lines if line.startswith("| scheme"))
    assert all(line.count("|") == header.count("|") for line in lines if line.startswith("| "))
