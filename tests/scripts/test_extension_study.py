"""scripts/extension_study.py: the fine-tuned context-extension study's jobs (names, the overrides each gets, parents
before extensions, DroPE as its paper runs it and its temperature's evaluations after them, PoSE), its listing that
writes nothing, its one-line refusals before anything is written, the design's derived settings (LongRoPE's
divisors, Self-Extend's group), and one slow end-to-end run on the tiny corpus."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
import torch
from cli_runs import TINY, assert_one_line_error, load_script
from generated_options import generated_cases, parser_of

from core.errors import PosGPTError
from model.pe.rope_scaling import ROPE_SCALINGS, RoPEScalingConfig, rope_inv_freq

SCRIPT = "scripts/extension_study.py"
study_script = load_script("extension_study")


def tiny(cli) -> list[str]:
    """The test model and corpus for every run of a study (the study chooses the schemes and evaluates every run)."""
    return [arg for arg in TINY if not arg.startswith(("pe=", "train.eval_after"))] + [f"data.files=[{cli.corpus}]"]


def jobs_of(directory: Path, *argv: str) -> list:
    study, _, _ = study_script.parse_study([str(directory), *argv])
    return study_script.study_jobs(study)


def test_the_jobs_of_a_small_study(cli, tmp_path):
    jobs = jobs_of(
        tmp_path, "--seed-list", "1,2", "--budgets", "20,40", "--methods", "pi,drope,training-free", *tiny(cli)
    )
    names = [job.name for job in jobs]
    assert names == [
        *("rope-16-s1", "rope-16-s2", "nope-16-s1", "nope-16-s2"),
        *("pi-20-s1", "pi-20-s2", "pi-40-s1", "pi-40-s2", "drope-20-s1", "drope-20-s2", "drope-40-s1", "drope-40-s2"),
        *("training-free-s1", "training-free-s2"),
        *(f"drope-{steps}-s{seed}-temperature" for steps in (20, 40) for seed in (1, 2)),
    ]
    assert [job.stage for job in jobs] == ["parents"] * 4 + ["extensions"] * 10 + ["evaluations"] * 4
    by_name = {job.name: job for job in jobs}
    lengths = "eval.lengths=[16,32,64,128,256]"
    rope, nope = set(by_name["rope-16-s2"].overrides), set(by_name["nope-16-s1"].overrides)
    assert {"pe=rope", "train.seed=2", "train.seq_len=16", lengths, "train.warmup_steps=1000"} <= rope
    assert {"pe=none", "train.seed=1", "train.seq_len=16", lengths} <= nope
    pi = by_name["pi-40-s2"]
    assert pi.run_dir == tmp_path / "pi-40-s2"
    assert {
        *("pe=rope", "pe.scaling.type=linear", "pe.scaling.factor=4", "train.seed=2", "train.seq_len=64"),
        *(f"train.init_from={tmp_path / 'rope-16-s2'}", "train.max_steps=40", "train.warmup_steps=4", "train.lr=2e-4"),
        lengths,
    } <= set(pi.overrides)
    assert "train.warmup_steps=1000" not in pi.overrides  # the design's schedule replaces the overrides'
    # DroPE as its paper: recalibrated at the parent's L and learning rate (the default's, 1e-3), scored zero-shot
    drope = set(by_name["drope-20-s1"].overrides)
    assert {"pe=none", "train.init_from_pe=replace", f"train.init_from={tmp_path / 'rope-16-s1'}"} <= drope
    assert {"train.seq_len=16", "train.lr=0.001", "train.warmup_steps=2", "train.max_steps=20", lengths} <= drope
    assert not any(arg in drope for arg in ("train.seq_len=64", "train.lr=2e-4"))
    temperature = by_name["drope-40-s2-temperature"]
    assert temperature.run_dir == tmp_path / "drope-40-s2" and temperature.marker == temperature.run_dir / "eval" / (
        ".temperature-done"
    )
    assert temperature.command() == [
        *("eval.py", f"run_dir={tmp_path / 'drope-40-s2'}"),
        *("model.attn_temperature.type=drope", "model.attn_temperature.c=0.1"),
    ]
    free = by_name["training-free-s1"]
    assert free.run_dir == tmp_path / "rope-16-s1" and free.overrides == ()
    # L = 16: W = 8, w = 1; G = 32 maps 16L's farthest distance (255) to 255 // 32 + 8 - 0 = 15 < 16
    assert free.variations == ("yarn:4", "ntk:4", "string:8:1", "self_extend:32:8")


def test_every_method_and_the_task_study(cli, tmp_path):
    jobs = jobs_of(tmp_path, "--seeds", "1", "--budgets", "5", "--factor", "2", "--task", "passkey")
    methods = ("plain", "pi", "ntk", "yarn", "llama3", "longrope", "drope", "drope_4l", "pose", "pose_yarn")
    assert [job.name for job in jobs] == [
        *("rope-64-s1", "nope-64-s1"),
        *(f"{method}-5-s1" for method in methods),
        *("training-free-s1", "drope-5-s1-temperature"),
    ]
    by_name = {job.name: job for job in jobs}
    longrope = by_name["longrope-5-s1"].overrides
    assert {"task=passkey", "train.seq_len=128", "eval.lengths=[64,128,256,512,1024]"} <= set(longrope)
    assert "pe.scaling.short_factor=[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]" in longrope  # passkey's heads: 128 / 4 wide
    assert not any(arg.startswith(("train.batch_size", "eval.max_tokens")) for arg in longrope)  # the task's own
    # the paper's DroPE at the task's L and lr; today's (drope_4l) as the other fine-tunes; PoSE at L covering 2L
    assert {"train.seq_len=64", "train.lr=0.001", "pe=none"} <= set(by_name["drope-5-s1"].overrides)
    assert {"train.seq_len=128", "train.lr=2e-4", "pe=none"} <= set(by_name["drope_4l-5-s1"].overrides)
    pose_yarn = set(by_name["pose_yarn-5-s1"].overrides)
    assert {"train.seq_len=64", "train.pose.target_len=128", "pe.scaling.type=yarn", "pe.scaling.factor=2"} <= pose_yarn
    assert "train.pose.target_len=128" in by_name["pose-5-s1"].overrides
    assert not any(arg.startswith("pe.scaling") for arg in by_name["pose-5-s1"].overrides)
    parents = [job for job in jobs if job.stage == "parents"]
    assert set(study_script.plan_stage(parents)) == {"rope-64-s1", "nope-64-s1"}  # train.py's planner accepts them


@pytest.mark.parametrize(("head_dim", "train_len", "factor"), [(16, 64, 16.0), (16, 64, 4.0), (64, 64, 4.0)])
def test_longropes_long_factors_are_yarns_divisors(head_dim, train_len, factor):
    base = 10000.0
    theta = rope_inv_freq(head_dim, base)
    yarn = RoPEScalingConfig("yarn", factor)
    scaled, _ = ROPE_SCALINGS["yarn"](theta, yarn, base, head_dim, train_len, 4 * train_len)
    ours = torch.tensor(study_script.yarn_divisors(head_dim, base, train_len, factor), dtype=torch.float64)
    torch.testing.assert_close(ours, theta / scaled)
    if (head_dim, factor) == (16, 16.0):  # results/width64-4layer-attention's unsearched LongRoPE
        assert [round(d, 4) for d in ours.tolist()] == [1, 1.4545, 2.6667, 16, 16, 16, 16, 16]


def test_self_extends_group_maps_the_longest_window_inside_l():
    assert study_script.self_extend_group(64, 32, 1024) == 32  # scripts/study_variations.json's self_extend:32:32
    for train_len in (16, 64, 100, 512):
        window = train_len // 2
        group = study_script.self_extend_group(train_len, window, 16 * train_len)
        assert (16 * train_len - 1) // group + window - window // group < train_len
        half = group // 2
        assert half < 2 or (16 * train_len - 1) // half + window - window // half >= train_len  # the smallest


def test_list_prints_the_jobs_and_writes_nothing(cli, tmp_path):
    directory = tmp_path / "study"
    done = cli.here(SCRIPT, str(directory), "--list", "--seeds", "1", "--budgets", "3", *tiny(cli))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 + 10 + 1 + 1 and lines[0].startswith("rope-16-s1\tparents\tpython train.py ")
    assert lines[-2] == f"training-free-s1\textensions\tpython eval.py run_dir={directory / 'rope-16-s1'} " + (
        "eval.variations=[yarn:4,ntk:4,string:8:1,self_extend:32:8]"
    )
    assert lines[-1] == f"drope-3-s1-temperature\tevaluations\tpython eval.py run_dir={directory / 'drope-3-s1'} " + (
        "model.attn_temperature.type=drope model.attn_temperature.c=0.1"
    )
    assert not directory.exists()


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["train.lr=-1"], ["job rope-16-s1 of the extension study", "train.lr"]),
        (["pe=alibi"], ["the study sets pe itself"]),
        (["pe.base=500"], ["the study sets pe.base itself"]),
        (["train.eval_after=false"], ["the study sets train.eval_after itself"]),
        (
            ["--methods", "plain,magic"],
            ["--methods takes some of plain,pi,ntk,yarn,llama3,longrope,drope,drope_4l,pose,pose_yarn,training-free"],
        ),
        (["--task", "nonsense"], ["--task takes none or a task"]),
        (["--budgets", "0"], ["--budgets"]),
        (["--part", "extensions"], ["job plain-3-s1 of the extension study", "train.init_from"]),  # no parents yet
        (["train.pose.target_len=64"], ["the study sets train.pose.target_len itself"]),
        # a setting only a later stage's job refuses: refused before the parents train, and by --list
        (["--methods", "pose", "train.random_positions=16"], ["job pose-3-s1 of the extension study", "use one"]),
        (["--list", "--methods", "pose", "train.random_positions=16"], ["job pose-3-s1", "use one of them"]),
        # an evaluation eval.py would refuse of a run that a job trains: refused before that run trains
        (["--methods", "plain,training-free", "model.attn_sink=true"], ["job training-free-s1 of", "no sink logit"]),
    ],
)
def test_a_bad_value_is_refused_in_one_line_before_anything_is_written(cli, tmp_path, argv, fragments):
    directory = tmp_path / "study"
    done = cli.here(SCRIPT, str(directory), "--seeds", "1", "--budgets", "3", *tiny(cli), *argv)
    assert_one_line_error(done, *fragments)
    assert not directory.exists()


@pytest.mark.slow
def test_a_tiny_study_trains_fine_tunes_evaluates_compares_and_then_skips_it_all(cli, tmp_path):
    directory = tmp_path / "study"
    # a val split of 1,340 tokens: 16L = 256 needs 512
    runs = [*tiny(cli), "train.max_steps=3", "data.val_fraction=0.05", "eval.protocols=[nonoverlapping]"]
    runs += ["eval.max_tokens=1024"]
    # two fine-tunes trained: plain, and DroPE as its paper (at L, then evaluated with its temperature too); the
    # other methods' jobs are planned below from the parent the study trains
    argv = [str(directory), "--seeds", "1", "--budgets", "2", "--methods", "plain,drope,training-free", *runs]
    done = cli.here(SCRIPT, *argv)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("rope-16-s1", "nope-16-s1", "plain-2-s1", "drope-2-s1"):
        results = json.loads((directory / name / "eval" / "extrapolation.json").read_text())
        assert {row["length"] for row in results["results"]} == {16, 32, 64, 128, 256}, name
    parent = json.loads((directory / "rope-16-s1" / "eval" / "extrapolation.json").read_text())
    variations = {row["variation"].split("(")[0] for row in parent["results"]}
    assert {"", "yarn:4", "ntk:4", "self_extend:32:8"} <= variations
    assert any(variation.startswith("string:8:1") for variation in variations)
    first = json.loads((directory / "plain-2-s1" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["init_from"] == str(directory / "rope-16-s1") and first["parent_pe"] == "rope"
    drope = json.loads((directory / "drope-2-s1" / "eval" / "extrapolation.json").read_text())
    assert drope["train_seq_len"] == 16 and drope["config"]["train"]["lr"] == 0.001  # the parent's L and lr
    losses = {(row["length"], json.dumps(row["attn_temperature"])): row["loss"] for row in drope["results"]}
    beta = json.dumps({"type": "drope", "c": 0.1})
    assert {length for length, temperature in losses if temperature == beta} == {16, 32, 64, 128, 256}
    assert losses[(16, beta)] == losses[(16, "null")] and losses[(256, beta)] != losses[(256, "null")]
    assert (directory / "drope-2-s1" / "eval" / ".temperature-done").read_text() == "2\n"
    report = (directory / "comparison.md").read_text()
    assert "plain" in report and "yarn:4" in report and "drope(c=0.1)" in report
    again = cli.here(SCRIPT, *argv)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "python train.py" not in again.stdout and "python eval.py" not in again.stdout
    assert again.stdout.count("skipped") == 6
    # every method's fine-tune from the parent that now exists is accepted (LongRoPE's lists fit the head, PoSE's
    # target the scheme, ...)
    every = [job for job in jobs_of(directory, "--seeds", "1", "--budgets", "2", *runs) if job.stage == "extensions"]
    assert len(study_script.plan_stage(every)) == 10
    # a directory holding a run of an earlier design under a job's name (DroPE at L where drope_4l trains at 4L)
    shutil.copytree(directory / "drope-2-s1", directory / "drope_4l-2-s1")
    (old,) = [job for job in every if job.name == "drope_4l-2-s1"]
    with pytest.raises(PosGPTError, match="job drope_4l-2-s1 of the extension study: .* train.seq_len=16 \\(now 64\\)"):
        study_script.plan_stage([old])
    # a run short of its (now longer) max_steps is resumed; one at it and evaluated is done
    (longer,) = study_script.plan_stage(jobs_of(directory, *argv[1:], "train.max_steps=4")[:1]).values()
    rope = jobs_of(directory, *argv[1:])[0]
    assert study_script.run_state(rope, longer) == "resume"
    assert study_script.run_state(rope, study_script.plan_stage([rope])[rope.name]) == "done"


@pytest.fixture(scope="module")
def planned_study(tmp_path_factory) -> Path:
    """The folder of the studies that are planned only (none of them is made)."""
    return tmp_path_factory.mktemp("planned") / "study"


@functools.cache  # planning writes nothing: the same study in the same folder plans the same jobs
def staged_jobs(directory: Path, part: str, *argv: str) -> list[tuple] | None:
    """The jobs the stages of ``part`` would run, each (name, command, variations); None where it is refused."""
    try:
        jobs = jobs_of(directory, "--part", part, *argv)
    except PosGPTError:
        return None
    stages = study_script.PARTS[part]
    return [(job.name, tuple(job.command()), getattr(job, "variations", ())) for job in jobs if job.stage in stages]


# Every option of the parser, with the values tests/support/generated_options.py draws from its declaration (names:
# a method and a task); --part is the axis of the test, and --list changes what is done with the jobs, not the jobs
# (test_list_prints_the_jobs_and_writes_nothing).
OPTION_CASES = [
    case
    for case in generated_cases(parser_of(study_script.parse_study), ("plain", "passkey"))
    if case.argv and not {"part", "list"} & set(case.dests)
]


def test_the_option_cases_cover_every_option_and_both_sides_of_each_domain():
    dests = {dest for case in OPTION_CASES for dest in case.dests}
    assert dests == {"seeds", "seed_list", "budgets", "factor", "task", "methods"}
    factors = {case.argv[1]: case.parsed for case in OPTION_CASES if case.dests == ("factor",)}
    assert factors["2"] and not factors["1"]  # [2, inf)'s edge, declared with the type


def test_a_value_its_type_refuses_is_refused(cli, tmp_path):
    """Each such value, in one line, before any job is made (the same under every part and method)."""
    for case in (case for case in OPTION_CASES if not case.parsed):
        with pytest.raises(PosGPTError):
            jobs_of(tmp_path, *case.argv, *tiny(cli))


@pytest.mark.parametrize("part", sorted(study_script.PARTS))
@pytest.mark.parametrize("methods", [(), ("--methods", "training-free")], ids=["all-methods", "training-free"])
@pytest.mark.parametrize("case", [case for case in OPTION_CASES if case.parsed], ids=lambda case: case.name)
def test_an_option_is_read_or_refused(cli, planned_study, part, methods, case):
    """Each option either changes a job the command runs or is refused in one line: never accepted and ignored. The
    study is planned in one folder for every case, so that the base's jobs are planned once a part."""
    if set(case.argv) & set(methods):
        pytest.skip("the option is the base's own")
    seeds = () if {"seeds", "seed_list"} & set(case.dests) else ("--seed-list", "1")
    base = [*methods, *seeds, *tiny(cli)]
    without = staged_jobs(planned_study, part, *base)
    if without is None:
        pytest.skip("the base itself is refused (--methods without the extensions stage)")
    given = staged_jobs(planned_study, part, *case.argv, *base)
    assert given is None or given != without, f"{case.name} accepted but changes no job of --part {part}"
