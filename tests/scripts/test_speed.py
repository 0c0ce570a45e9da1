"""scripts/speed.py and scripts/speed_nanogpt.py end to end on tiny configs: one parseable JSON line per scheme."""

import json
import subprocess
import sys

import pytest
import torch
from cli_runs import REPO, load_script

FIELDS = {"pe", "device", "tokens_per_s", "mfu", "peak_memory_mb", "memory_metric", "step_ms", "config"}


def json_lines(result: subprocess.CompletedProcess) -> list[dict]:
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_bench_prints_one_json_line_per_scheme_with_eval(cli):
    records = json_lines(
        cli.here(  # in-process, as python scripts/speed.py ... runs
            "scripts/speed.py",
            "pe=alibi,learned",
            "model.n_layer=1",
            "model.n_head=2",
            "model.n_embd=32",
            "model.vocab_size=512",
            "train.seq_len=32",
            "train.batch_size=2",
            "--warmup",
            "1",
            "--steps",
            "2",
            "--eval-length",
            "128",
        )
    )
    assert [r["pe"] for r in records] == ["alibi", "learned"]
    for record in records:
        assert FIELDS <= record.keys()
        assert record["tokens_per_s"] > 0 and record["step_ms"] > 0 and record["peak_memory_mb"] > 0
        assert record["mfu"] is None  # CPU: no peak FLOP/s to compare with
        assert record["config"]["seq_len"] == 32 and record["config"]["fused_ce"] is True
        assert record["config"]["attn_backend"] == "sdpa" and record["config"]["sdpa_backend"] == "auto"
        assert record["eval"]["length"] == 128
    assert records[0]["eval"]["tokens_per_s"] > 0
    assert "at most 32 positions" in records[1]["eval"]["error"]  # a learned table cannot go beyond training


def test_bench_splits_schemes_and_rejects_unknown_flags(capsys):
    speed = load_script("speed")
    args, overrides = speed.parse_args(["pe=rope,alibi", "pe.base=500", "--steps", "4"])
    assert args.steps == 4 and speed.split_schemes(overrides) == (["rope", "alibi"], ["pe.base=500"])
    assert speed.split_schemes(["model=gpt2"]) == ([None], ["model=gpt2"])
    with pytest.raises(SystemExit) as exit_info:  # main: one line, exit 2 (parse_args raises a PosGPTError)
        speed.main(["--stepz", "2"])
    err = capsys.readouterr().err
    assert (
        exit_info.value.code == 2 and err.startswith("error: unrecognized arguments: --stepz") and err.count("\n") == 1
    )


def test_the_compile_mode_reaches_torch_compile_and_needs_compilation(cli, monkeypatch):
    """--compile-mode is torch.compile's mode for the timed step, recorded; without train.compile=true (which alone
    compiles on CPU, and says what it means on any device) it is one line and exit 2, before anything runs."""
    tiny = ["pe=none", "model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.vocab_size=512"]
    tiny += ["train.seq_len=16", "train.batch_size=2", "--warmup", "0", "--steps", "1"]
    refused = cli.here("scripts/speed.py", *tiny, "--compile-mode", "max-autotune")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr == "error: --compile-mode max-autotune needs train.compile=true (it compiles nothing else)\n"
    modes = []

    def compile_(model, mode=None, **options):  # records the mode; runs the model as it is
        modes.append(mode)
        return model

    monkeypatch.setattr("torch.compile", compile_)
    for mode, want in (("max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs"), ("default", None)):
        (record,) = json_lines(cli.here("scripts/speed.py", *tiny, "train.compile=true", "--compile-mode", mode))
        assert modes[-1] == want and record["config"]["compile_mode"] == mode and record["config"]["compile"] is True


@pytest.mark.skipif(torch.cuda.is_available(), reason="the kernels it picks run there")
def test_the_sdpa_backend_limits_sdpa_to_one_kernel_and_needs_cuda(cli):
    """--sdpa-backend: every SDPA call while a scheme is timed may use that one kernel, and a call it cannot take
    raises, no silent fallback (on the CPU, cuDNN's and the memory-efficient kernels take none); on a machine
    without CUDA the option is one line and exit 2 before anything runs."""
    speed = load_script("speed")
    q = torch.randn(1, 2, 8, 16, generator=torch.Generator().manual_seed(0))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with speed.sdpa_backend("auto"):
        torch.testing.assert_close(sdpa(q, q, q, is_causal=True), sdpa(q, q, q, is_causal=True))
    for name in ("cudnn", "efficient"):
        with speed.sdpa_backend(name), pytest.raises(RuntimeError):
            sdpa(q, q, q, is_causal=True)
    tiny = ["pe=none", "model.n_layer=1", "model.n_head=2", "model.n_embd=32", "train.seq_len=16", "--steps", "1"]
    refused = cli.here("scripts/speed.py", *tiny, "--sdpa-backend", "cudnn")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr == "error: --sdpa-backend cudnn needs a CUDA device (the kernels it picks are CUDA's)\n"


def test_a_failing_scheme_is_recorded_and_the_next_runs_and_an_interruption_keeps_what_ran(tmp_path, monkeypatch):
    """A scheme whose step raises (a kernel that does not compile, memory that runs out) becomes {pe, error} and the
    next scheme runs; each is saved to --record as soon as it ran, in one run entry, so that a command stopped
    outright (SIGKILL) or interrupted (timeout -s INT) keeps the records so far."""
    speed = load_script("speed")
    record = tmp_path / "runs.json"

    def bench(cfg, args):
        if cfg.pe.name == "alibi":
            raise RuntimeError("out of resource: shared memory\ntraceback")
        if cfg.pe.name == "t5":  # what a kill at this point would leave
            (saved,) = json.loads(record.read_text())["runs"]
            assert [r["pe"] for r in saved["output"]] == ["alibi", "rope"]
            raise KeyboardInterrupt
        return {"pe": cfg.pe.name, "tokens_per_s": 1.0}

    monkeypatch.setattr(speed, "bench_scheme", bench)
    with pytest.raises(SystemExit):  # 130, as an interrupted command
        speed.main(["pe=alibi,rope,t5,none", "--record", str(record)])
    (run,) = json.loads(record.read_text())["runs"]
    assert run["output"] == [
        {"pe": "alibi", "error": "RuntimeError: out of resource: shared memory"},
        {"pe": "rope", "tokens_per_s": 1.0},
    ]


def test_a_failed_scheme_makes_the_command_fail_after_recording_every_scheme(tmp_path, monkeypatch, capsys):
    speed = load_script("speed")

    def bench(cfg, args):
        if cfg.pe.name == "alibi":
            raise RuntimeError("out of resource: shared memory")
        return {"pe": cfg.pe.name, "tokens_per_s": 1.0}

    monkeypatch.setattr(speed, "bench_scheme", bench)
    record = tmp_path / "runs.json"
    with pytest.raises(SystemExit) as exit_info:
        speed.main(["pe=rope,alibi,none", "--record", str(record)])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == "error: 1 of 3 schemes failed (alibi); see their records\n"
    (run,) = json.loads(record.read_text())["runs"]
    assert [r["pe"] for r in run["output"]] == ["rope", "alibi", "none"] and "error" in run["output"][1]


FAKE_NANOGPT = """
from dataclasses import dataclass
import torch

@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True

class GPT(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.wte = torch.nn.Embedding(config.vocab_size, config.n_embd)

    def get_num_params(self):
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx, targets):
        logits = self.wte(idx) @ self.wte.weight.t()
        return logits, torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        return torch.optim.AdamW(self.parameters(), lr=learning_rate, betas=betas, weight_decay=weight_decay)
"""


@pytest.mark.slow
def test_bench_nanogpt_prints_the_same_fields(tmp_path):
    """A stand-in with nanoGPT's interface (the real model.py is not part of posgpt)."""
    model_py = tmp_path / "model.py"
    model_py.write_text(FAKE_NANOGPT)
    # a process of its own: the stand-in is imported as `model`, which is posgpt's package in this process
    (record,) = json_lines(
        subprocess.run(
            [
                sys.executable,
                "scripts/speed_nanogpt.py",
                "--model-py",
                str(model_py),
                "--n-embd",
                "8",
                "--seq-len",
                "8",
                "--batch-size",
                "2",
                "--warmup",
                "1",
                "--steps",
                "2",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
    )
    assert FIELDS <= record.keys() and record["impl"] == "nanoGPT" and record["tokens_per_s"] > 0
