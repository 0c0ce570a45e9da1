"""scripts/compare.py and scripts/study.sh on real runs (a study of tiny runs made in two parts), plus
the seed grouping, the confidence-interval tables and the errors, on hand-made runs."""

import json
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
from cli_runs import load_script
from omegaconf import OmegaConf
from repo_root import REPO
from tiny_checkpoint import make_run

from core.checkpoint_io import load_checkpoint
from core.errors import PosGPTError
from evaluation.results import format_number, format_ppl
from evaluation.stats import Estimate, clearly_different
from experiment.compose import compose_config
from experiment.config import TrainConfig
from experiment.settings import config_for_evaluation, trained_config
from reports.perplexity import entries_of, markdown_report, ppl_estimate, ppl_values, ratio_estimate
from reports.runs import Entry, Run, evaluated_with, group_by_seed, group_labels, load_runs, typed_config
from reports.tables import find_baseline, paired_report

TINY = [
    "data=text",
    "data.val_fraction=0.2",
    "model.n_layer=1",
    "model.n_embd=32",
    "model.n_head=2",
    "train.seq_len=16",
    "train.batch_size=4",
    "train.max_steps=6",
    "train.val_batches=2",
    "train.num_threads=1",
    "logging.wandb.mode=disabled",
    "logging.progress=false",
    "eval.max_tokens=256",
    "eval.length_multipliers=[1,2,4,8]",
]


compare = load_script("compare")


def run(*args, cache, env=None):
    result = subprocess.run(
        [*map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "POSGPT_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1", **(env or {})},
    )
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """scripts/study.sh twice: rope with seeds 1 and 2 (also evaluated with YaRN), then a part added to the same
    study with one more variation (NTK): seed 1 of rope, rnope and learned, where rope's seed 1 is trained and
    evaluated with YaRN already (only NTK is evaluated) and rnope is refused by the 1-layer model (its pattern has
    four layers)."""
    tmp = tmp_path_factory.mktemp("study")
    corpus, study_dir = tmp / "corpus.txt", tmp / "study"
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    corpus.write_text("\n".join((stdlib / name).read_text() for name in ("textwrap.py", "string.py", "bisect.py")))

    def study_sh(*args, variations="[yarn:4]"):
        return run(
            "bash",
            "scripts/study.sh",
            *args,
            study_dir,
            f"data.files=[{corpus}]",
            *TINY,
            cache=tmp / "cache",
            env={"EVAL_VARIATIONS": variations},
        )

    study_sh("--seeds", "2", "--schemes", "rope")
    first_table = (study_dir / "comparison.md").read_text()
    checkpoint = study_dir / "rope-s1" / "checkpoints" / "last.pt"
    before = checkpoint.stat().st_mtime_ns, yarn_rows(study_dir / "rope-s1")
    again = study_sh("--seed-list", "1", "--schemes", "rope,rnope,learned", variations="[yarn:4,ntk:4]")
    unchanged = before == (checkpoint.stat().st_mtime_ns, yarn_rows(study_dir / "rope-s1"))
    return tmp, study_dir, first_table, again.stdout + again.stderr, unchanged


def yarn_rows(run_dir: Path) -> list[dict]:
    document = json.loads((run_dir / "eval" / "extrapolation.json").read_text())
    return [row for row in document["results"] if row["variation_settings"]["scaling"]["type"] == "yarn"]


@pytest.mark.slow
@pytest.mark.e2e
def test_study_trains_each_seed_evaluates_rope_scalings_and_compares(study):
    _, study_dir, first_table, *_ = study
    for seed in (1, 2):
        assert load_checkpoint(study_dir / f"rope-s{seed}")["config"]["train"]["seed"] == seed
    document = json.loads((study_dir / "rope-s2" / "eval" / "extrapolation.json").read_text())
    settings = {(r["protocol"], r["variation_settings"]["scaling"]["type"]) for r in document["results"]}
    assert settings == {
        ("nonoverlapping", "none"),
        ("sliding", "none"),
        ("nonoverlapping", "yarn"),
        ("sliding", "yarn"),
    }
    assert "| setting | seeds | 16 (1×) | 32 (2×) | 64 (4×) | 128 (8×) |" in first_table
    rows = table_rows(first_table)
    assert rows.keys() == {"rope", "rope yarn:4"} and all(cells[0] == "2" for cells in rows.values())
    assert all("±" in cell for cells in rows.values() for cell in cells[1:])
    assert "ppl@kL / ppl@L" in first_table and "intervals do not overlap" in first_table


@pytest.mark.slow
@pytest.mark.e2e
def test_study_run_again_skips_what_is_done_and_adds_the_rest(study):
    _, study_dir, _, output, unchanged = study
    assert output.count("nothing to do") == 1 and unchanged  # rope-s1: not trained again, its YaRN rows kept
    assert "study: pe=rnope is refused with these settings; its runs are skipped" in output
    assert {p.name for p in study_dir.iterdir() if p.is_dir()} == {"rope-s1", "rope-s2", "learned-s1"}
    rows = table_rows((study_dir / "comparison.md").read_text())
    assert rows["learned"][0] == "1" and "±" not in rows["learned"][1] and rows["rope"][0] == "2"
    assert rows["learned"][2:] == ["n/a"] * 3  # one seed, beyond its 16 positions
    text = (study_dir / "comparison.md").read_text()  # one seed: never part of a claimed difference
    assert "one seed, not compared: learned" in text or "lowest learned, one seed: no interval" in text
    for name in ("comparison.png", "comparison_per_position.png", "comparison_sliding.png", "comparison_val_loss.png"):
        assert (study_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.e2e
def test_study_evaluates_only_the_variations_a_run_lacks(study):
    _, study_dir, _, output, _ = study
    eval_dir = study_dir / "rope-s1" / "eval"
    document = json.loads((eval_dir / "extrapolation.json").read_text())
    scalings = {row["variation_settings"]["scaling"]["type"] for row in document["results"]}
    assert scalings == {"none", "yarn", "ntk"}
    assert "replaced" not in output  # YaRN's rows were kept, not measured again
    assert (eval_dir / ".variations-done").read_text().strip() == "[yarn:4,ntk:4]"


@pytest.mark.slow
def test_study_lists_every_configured_scheme_that_train_would_accept(tmp_path):
    """--list plans every job as the study does: a scheme train.py refuses with the study's settings (the per-layer
    presets need 4 layers; the default model has 2) is said so and not listed, and nothing is made. A narrow model
    of the default depth: each job's rehearsal (its first forward pass) is then cheap, and what refuses a scheme is
    its layers."""
    study_dir = tmp_path / "study"
    narrow = ("model.n_embd=32", "model.n_head=2")
    done = run("bash", "scripts/study.sh", "--list", "--seeds", "1", study_dir, *narrow, cache=tmp_path)
    schemes = sorted(p.stem for p in (REPO / "configs" / "pe").glob("*.yaml"))
    refused = sorted(line.split("pe=")[1].split()[0] for line in done.stderr.splitlines() if "is refused" in line)
    assert len(schemes) >= 5 and {"rnope", "llama4_inope", "swan"} <= set(refused)
    assert all("model.n_layer" in line for line in done.stderr.splitlines() if "is refused" in line)  # layers only
    accepted = [scheme for scheme in schemes if scheme not in refused]
    assert done.stdout.split() == [f"{study_dir}/{scheme}-s{seed}" for scheme in accepted for seed in (1,)]
    assert not study_dir.exists()


def table_rows(markdown):
    """{label: [seeds, cell, ...]} of the first table in a comparison."""
    table = markdown.split("\n\n")[1]
    return {
        cells[0]: cells[1:]
        for line in table.splitlines()[2:]
        for cells in [[cell.strip() for cell in line.strip("|").split("|")]]
    }


@pytest.mark.slow
@pytest.mark.e2e
def test_compare_one_seed_shows_values_without_intervals(study, tmp_path):
    _, study_dir, *_ = study
    md = tmp_path / "one.md"
    compare.main(
        [
            str(study_dir / "rope-s1"),
            str(study_dir / "learned-s1"),
            "--protocol",
            "sliding",
            "--markdown",
            str(md),
            "--plot",
            str(tmp_path / "s.png"),
            "--ratios",
        ]
    )
    text = md.read_text()
    assert not any("±" in cell for cells in table_rows(text).values() for cell in cells)
    assert "no difference is claimed" in text
    assert "sliding protocol, stride L/2" in text
    document = json.loads((study_dir / "rope-s1" / "eval" / "extrapolation.json").read_text())
    ppl = {
        r["length"]: r["ppl"]
        for r in document["results"]
        if r["protocol"] == "sliding" and r["variation_settings"]["scaling"]["type"] == "none"
    }
    assert table_rows(text)["rope"][:2] == ["1", format_ppl(ppl[16])]
    ratios = text.split("ppl@kL / ppl@L")[1]
    assert f"| rope | 1 | {format_number(ppl[32] / ppl[16], 3)} |" in ratios.replace("**", "")


def export(cli, *args):
    """``python scripts/export_results.py <args>``, in-process."""
    return cli.here("scripts/export_results.py", *map(str, args))


@pytest.mark.slow
@pytest.mark.e2e
def test_exported_results_record_the_trained_config_and_compare_as_the_runs_do(cli, study, tmp_path):
    """extrapolation.json records the checkpoint's config (end of training, and eval.py's YaRN rows);
    export_results.py copies what compare.py reads, without checkpoints, adding the config to a file written
    before it was recorded; compare.py then writes the same report from the copies as from the runs."""
    _, study_dir, *_ = study
    runs = [study_dir / "rope-s1", tmp_path / "older" / "rope-s2"]
    shutil.copytree(study_dir / "rope-s2", runs[1])
    for run_dir in runs:
        document = json.loads((run_dir / "eval" / "extrapolation.json").read_text())
        assert document["config"] == load_checkpoint(run_dir)["config"]
    older = runs[1] / "eval" / "extrapolation.json"
    document = json.loads(older.read_text())
    del document["config"]  # as posgpt wrote it before 2026-11-23
    older.write_text(json.dumps(document))
    done = export(cli, *runs, "--to", tmp_path / "exported")
    assert done.returncode == 0, done.stderr
    copies = [tmp_path / "exported" / name for name in ("rope-s1", "rope-s2")]
    assert sorted(p.name for p in copies[1].rglob("*")) == [
        "eval",
        "extrapolation.csv",
        "extrapolation.json",
        "metrics.jsonl",
        "overrides.yaml",
    ]
    exported = json.loads((copies[1] / "eval" / "extrapolation.json").read_text())
    assert exported == {**document, "config": load_checkpoint(runs[1])["config"]}
    reports = []
    for name, dirs in (("runs", runs), ("copies", copies)):
        compare.main(
            [
                *map(str, dirs),
                "--ratios",
                "--markdown",
                str(tmp_path / f"{name}.md"),
                "--plot",
                str(tmp_path / f"{name}.png"),
                "--val-curve",
                str(tmp_path / f"{name}-val.png"),
            ]
        )
        reports.append((tmp_path / f"{name}.md").read_text())
    assert reports[0] == reports[1] and "| rope yarn:4 | 2 |" in reports[0]


@pytest.mark.slow
@pytest.mark.e2e
def test_a_run_from_before_a_setting_existed_groups_with_newer_runs(study, tmp_path):
    """A run's config lacks settings added after it was trained; they read as their defaults, so the run
    stays one seed of its setting rather than a setting of its own."""
    _, study_dir, *_ = study
    copies = [tmp_path / name for name in ("rope-s1", "rope-s2")]
    for copy in copies:
        shutil.copytree(study_dir / copy.name / "eval", copy / "eval")
    path = copies[0] / "eval" / "extrapolation.json"
    document = json.loads(path.read_text())
    del document["config"]["pe"]["scaling"]["attention_factor"]  # added on 2026-11-23, default null
    path.write_text(json.dumps(document))
    compare.main([*map(str, copies), "--markdown", str(tmp_path / "c.md"), "--plot", str(tmp_path / "c.png")])
    assert "| rope | 2 |" in (tmp_path / "c.md").read_text()


@pytest.mark.slow
@pytest.mark.e2e
def test_export_refuses_results_of_another_step_than_the_checkpoint(cli, study, tmp_path):
    """A file without a recorded config gets the checkpoint's only if it scored that checkpoint."""
    _, study_dir, *_ = study
    run_dir = tmp_path / "rope-s1"
    shutil.copytree(study_dir / "rope-s1", run_dir)
    path = run_dir / "eval" / "extrapolation.json"
    document = json.loads(path.read_text())
    del document["config"]
    path.write_text(json.dumps({**document, "step": document["step"] - 1}))
    done = export(cli, run_dir, "--to", tmp_path / "exported")
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0, done.stderr
    step = document["step"]
    assert f"its results scored step {step - 1}, its checkpoint is at step {step}" in done.stderr
    assert not (tmp_path / "exported").exists()


@pytest.mark.slow
@pytest.mark.e2e
def test_compare_refuses_results_without_checkpoint_or_recorded_config(cli, study, tmp_path):
    _, study_dir, *_ = study
    copy = tmp_path / "rope-s1"
    shutil.copytree(study_dir / "rope-s1" / "eval", copy / "eval")
    path = copy / "eval" / "extrapolation.json"
    document = json.loads(path.read_text())
    del document["config"]  # as written before posgpt recorded it
    path.write_text(json.dumps(document))
    done = cli.here(
        "scripts/compare.py", str(copy), "--markdown", str(tmp_path / "c.md"), "--plot", str(tmp_path / "c.png")
    )
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0, done.stderr
    assert f"{copy} has no checkpoint" in done.stderr and "does not say how the run was trained" in done.stderr
    assert not (tmp_path / "c.md").exists()


@pytest.mark.slow
@pytest.mark.e2e
def test_compare_refuses_a_run_given_twice(study, capsys):
    _, study_dir, *_ = study
    with pytest.raises(SystemExit) as exit_info:
        compare.main([str(study_dir / "rope-s1"), str(study_dir / "rope-s1")])
    assert exit_info.value.code == 2 and "same train.seed (1)" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.e2e
def test_compare_names_a_corrupt_or_malformed_results_file(cli, study, tmp_path):
    """Through the command line (in-process): one line naming the file, exit code 2, no traceback."""
    tmp, study_dir, *_ = study
    for name, content in (("corrupt", '{"pe": "rope", "results": [ {"len'), ("malformed", "[]")):
        run_dir = tmp_path / name
        (run_dir / "eval").mkdir(parents=True)
        (run_dir / "eval" / "extrapolation.json").write_text(content)
        if name == "malformed":  # the function that reads them
            with pytest.raises(PosGPTError, match=r"malformed: expected a JSON object, found list"):
                load_runs([run_dir], trained_config)
            continue
        done = cli.here("scripts/compare.py", str(study_dir / "rope-s1"), str(run_dir))
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip().count("\n") == 0
        assert f"{run_dir}/eval/extrapolation.json is damaged or not JSON" in done.stderr


@pytest.mark.slow
@pytest.mark.e2e
def test_compare_without_results_says_how_to_make_them(study, capsys):
    tmp, *_ = study
    with pytest.raises(SystemExit) as exit_info:
        compare.main([str(tmp), "--markdown", str(tmp / "x.md")])
    assert exit_info.value.code == 2 and "no eval/extrapolation.json" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.e2e
def test_eval_py_rejects_a_scaling_for_a_scheme_without_one(study):
    _, study_dir, *_ = study
    with pytest.raises(PosGPTError, match="pe.scaling.type"):
        config_for_evaluation(load_checkpoint(study_dir / "learned-s1"), ["pe.scaling.type=yarn"])


# Hand-made runs: grouping, labels, interval tables and the difference rule, without training.


def fake_run(pe, seed, ppls, pe_keys=None):
    config = {
        "pe": {"name": pe, **(pe_keys or {})},
        "train": {"seed": seed, "seq_len": 16, "num_threads": seed},
        "model": {"n_layer": 1},
        "logging": {"wandb": {"name": f"r{seed}"}},
    }
    rows = [
        {
            "length": length,
            "protocol": "nonoverlapping",
            "stride": None,
            "scaling": None,
            "data": "d",
            "ppl": ppl,
            "tokens": 64,
            "target_range": [64, 128],
        }
        for length, ppl in ppls.items()
    ]
    return Run(Path(f"/runs/{pe}-{seed}"), {"pe": pe, "train_seq_len": 16, "step": 10, "results": rows}, config)


def test_runs_that_differ_only_in_seed_and_run_settings_are_one_group():
    runs = [
        fake_run("rope", 1, {16: 10.0}),
        fake_run("alibi", 1, {16: 11.0}),
        fake_run("rope", 2, {16: 12.0}),
        fake_run("rope", 3, {16: 9.0}, {"base": 500000}),
    ]
    groups = group_by_seed(runs)
    assert [[r.config["train"]["seed"] for r in g] for g in groups] == [[1, 2], [1], [3]]
    assert group_labels(groups) == ["rope", "alibi", "rope pe.base=500000"]


def test_cells_are_mean_and_t_interval_and_the_rule_names_clear_differences():
    runs = [
        fake_run("rope", s, {16: p16, 32: p32}) for s, p16, p32 in ((1, 10.0, 20.0), (2, 11.0, 22.0), (3, 12.0, 24.0))
    ]
    runs += [fake_run("alibi", s, {16: p, 32: p}) for s, p in ((1, 10.5), (2, 11.5), (3, 12.5))]
    entries = entries_of(group_by_seed(runs), "nonoverlapping", None, "d")
    rope, alibi = entries
    estimate = ppl_estimate(rope, 16)  # mean 11, s = 1, half-width t(0.975, 2) / sqrt(3) = 2.484
    assert (estimate.mean, estimate.n) == (11.0, 3) and estimate.half_width == pytest.approx(2.4841377, rel=1e-6)
    ratio = ratio_estimate(rope, 2.0)  # every seed's ratio is exactly 2: a zero-width interval
    assert ratio == Estimate(2.0, 0.0, 3)
    report = markdown_report(entries, "nonoverlapping", None, "d", ratios=True)
    assert "| rope | 3 | **11.00 ± 2.48** | 22.00 ± 4.97 |" in report
    assert "| alibi | 3 | 11.50 ± 2.48 | **11.50 ± 2.48** |" in report
    assert (
        "- 16 (1×): lowest rope; intervals apart (clearly worse): no setting; "
        "intervals overlap (not distinguishable): alibi" in report
    )
    assert "| rope | 3 | 2.000 ± 0.000 |" in report and "| alibi | 3 | **1.000 ± 0.000** |" in report
    assert "- 2×: lowest alibi; intervals apart (clearly worse): rope;" in report  # the ratios' intervals


def test_a_seed_without_a_value_is_counted_in_its_cell():
    runs = [fake_run("rope", 1, {16: 10.0, 32: 20.0}), fake_run("rope", 2, {16: 12.0, 32: None})]
    (entry,) = entries_of(group_by_seed(runs), "nonoverlapping", None, "d")
    report = markdown_report([entry], "nonoverlapping", None, "d", ratios=False)
    assert "| rope | 2 | **11.00 ± 12.71** | **20.00 (n=1)** |" in report


@pytest.mark.slow
@pytest.mark.e2e
def test_compare_val_curve_tabulates_the_logged_validation_loss_over_seeds(study, tmp_path):
    """--val-curve: per setting, the validation loss each seed logged (metrics.jsonl), mean ± t-interval."""
    _, study_dir, *_ = study
    md, png = tmp_path / "val.md", tmp_path / "val.png"
    compare.main(
        [
            str(study_dir / "rope-s1"),
            str(study_dir / "rope-s2"),
            "--markdown",
            str(md),
            "--plot",
            str(tmp_path / "c.png"),
            "--val-curve",
            str(png),
        ]
    )
    logged = [
        {
            json.loads(line)["step"]: json.loads(line)["val_loss"]
            for line in (study_dir / f"rope-s{seed}" / "metrics.jsonl").read_text().splitlines()
            if "val_loss" in line
        }
        for seed in (1, 2)
    ]
    step = max(logged[0])
    a, b = logged[0][step], logged[1][step]
    half_width = 12.7062047 * abs(a - b) / 2  # t_{0.975, 1} * s / sqrt(2), s = |a - b| / sqrt(2)
    section = md.read_text().split("Validation loss during training")[1]
    row = next(line for line in section.splitlines() if line.startswith("| rope |"))
    assert row.split("|")[2].strip() == "2"
    assert f"{format_number((a + b) / 2, 3)} ± {format_number(half_width, 3)}" in row.replace("**", "")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.e2e
def test_compare_val_curve_refuses_a_run_without_logged_validation_loss(cli, study, tmp_path):
    """Through the command line (in-process): a run whose metrics.jsonl has no val_loss is refused with one
    line naming the file."""
    _, study_dir, *_ = study
    run_dir = tmp_path / "rope-s1"
    shutil.copytree(study_dir / "rope-s1", run_dir)
    metrics = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    metrics.write_text("".join(json.dumps(record) + "\n" for record in records if "val_loss" not in record))
    done = cli.here("scripts/compare.py", str(run_dir), "--val-curve", str(tmp_path / "v.png"))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().count("\n") == 0
    assert f"{metrics} has no validation loss" in done.stderr
    assert not (tmp_path / "v.png").exists()


def test_labels_name_the_differing_keys_or_the_run_directory_when_many_differ(tmp_path):
    def fake(name, **train):
        config = {
            "model": {"n_embd": 64},
            "pe": {"name": "rope", "base": 10000.0},
            "train": {"seed": 1, "seq_len": 64, "lr": 1e-3, "max_steps": 1200, "init_from": None, **train},
        }
        return Run(tmp_path / name, {"pe": "rope", "step": 10}, config)

    parent, base = fake("rope-64-s1"), fake("rope-base-s1")
    base.config["pe"]["base"] = 500000.0
    extended = fake("rope-256-s2", seq_len=256, lr=2e-4, max_steps=300, init_from="/runs/rope-64")
    assert group_labels([[parent], [base]]) == ["rope pe.base=10000.0", "rope pe.base=500000.0"]
    assert group_labels([[parent], [extended]]) == ["rope rope-64", "rope rope-256"]
    # Directories of the same name in different studies: as many parents as it takes to tell them apart.
    wide = fake("w128/rope-s1", seq_len=256, lr=2e-4, max_steps=300, init_from="/runs/x")
    long = fake("s2400/rope-s1", max_steps=2400, lr=3e-4, seq_len=128, init_from="/runs/y")
    assert group_labels([[parent], [wide], [long]]) == ["rope rope-64", "rope w128/rope", "rope s2400/rope"]


def test_a_value_most_settings_share_is_left_out_of_the_labels(tmp_path):
    """Plain RoPE beside RoPE with a sink and RoPE with SSMax reads "rope"; each other names only its own key. Two
    settings (a tie) keep both values, as before."""

    def fake(name, sink=False, temperature="none"):
        config = {
            "model": {"n_embd": 64, "attn_sink": sink, "attn_temperature": {"type": temperature}},
            "pe": {"name": "rope", "base": 10000.0},
            "train": {"seed": 1, "seq_len": 64},
        }
        return Run(tmp_path / name, {"pe": "rope", "step": 10}, config)

    plain, sink, ssmax = fake("rope-s1"), fake("sink-s1", sink=True), fake("ssmax-s1", temperature="ssmax")
    assert group_labels([[plain], [sink], [ssmax]]) == [
        "rope",
        "rope model.attn_sink=True",
        "rope model.attn_temperature.type=ssmax",
    ]
    assert group_labels([[plain], [sink]]) == ["rope model.attn_sink=False", "rope model.attn_sink=True"]
    both = fake("both-s1", sink=True, temperature="ssmax")
    labels = group_labels([[plain], [sink], [ssmax], [both]])
    assert len(set(labels)) == 4, labels


def test_a_temperature_a_run_was_trained_with_is_not_labelled_again_as_a_variation(tmp_path):
    """A run trained with SSMax: its rows as trained add nothing to the setting's label (which names the key);
    rows evaluated with another temperature, or a variation, say so."""

    def trained_with(temperature):
        settings = {"type": temperature, "floor_scale": None, "attn_scale": 0.1}
        return Run(tmp_path / temperature, None, {"model": {"attn_temperature": settings}})

    ssmax, plain = trained_with("ssmax"), trained_with("none")
    trained, logn = {"attn_temperature": {"type": "ssmax"}}, {"attn_temperature": {"type": "logn"}}
    assert evaluated_with(trained, ssmax) == ""
    assert evaluated_with({**trained, "variation": "yarn:16"}, ssmax) == "yarn:16"
    assert evaluated_with(logn, ssmax) == "logn"
    assert evaluated_with(trained, plain) == "ssmax"  # a run trained without one, evaluated with SSMax
    assert evaluated_with({"attn_temperature": None}, plain) == ""


def test_paired_differences_cancel_what_the_seed_does_to_every_scheme():
    """Seeds move both settings together (same batches): the unpaired intervals overlap, yet every seed has
    B exactly 10% above A, which the paired report finds (+10.0% ± 0.0%), with a t-interval otherwise."""

    def entry(label, ppl_by_seed):
        return Entry(label, label, 64, [{64: {"ppl": ppl}} for ppl in ppl_by_seed.values()], list(ppl_by_seed))

    a = entry("a", {1: 10.0, 2: 12.0, 3: 11.0})
    b = entry("b", {3: 12.1, 1: 11.0, 2: 13.2})  # seeds listed in another order: paired by train.seed
    c = entry("c", {1: 10.0, 2: 13.0, 3: 11.0})
    assert not clearly_different(ppl_estimate(a, 64), ppl_estimate(b, 64))
    lines = paired_report([a, b, c], [64], ["64 (1×)"], ppl_values)
    rows = {
        cells[0]: cells[1]
        for line in "\n".join(lines).splitlines()
        if line.startswith("| ")
        for cells in [[cell.strip() for cell in line.strip("|").split("|")]]
    }
    assert rows["a"] == "lowest" and rows["b"] == "**+10.0% ± 0.0%**"
    ratios = [1.0, 13 / 12, 1.0]  # c / a per seed: not significant with 3 seeds
    mean = sum(ratios) / 3 - 1
    sd = (sum((r - 1 - mean) ** 2 for r in ratios) / 2) ** 0.5
    assert rows["c"] == f"{mean:+.1%} ± {4.30265273 * sd / 3**0.5:.1%}"
    assert lines[-1] == "- 64 (1×): lowest a; interval excludes 0 (clearly different): b; interval includes 0: c"
    one_seed = entry("d", {1: 9.0})  # lower, but one seed: not the reference, not paired
    lines = paired_report([a, b, one_seed], [64], ["64 (1×)"], ppl_values)
    assert "| d | - |" in "\n".join(lines) and "| a | lowest |" in "\n".join(lines)


def test_paired_differences_against_a_baseline_instead_of_the_lowest():
    def entry(label, ppl_by_length_and_seed):
        seeds = sorted(next(iter(ppl_by_length_and_seed.values())))
        per_seed = [
            {length: {"ppl": by_seed[seed]} for length, by_seed in ppl_by_length_and_seed.items()} for seed in seeds
        ]
        return Entry(label, label, 64, per_seed, seeds)

    rope = entry("rope", {64: {1: 10.0, 2: 12.0}, 128: {1: 20.0, 2: 24.0}})
    alibi = entry("alibi", {64: {1: 11.0, 2: 13.2}, 128: {1: 11.0, 2: 13.2}})  # +10% at 1x, -45% at 2x
    lines = paired_report(
        [rope, alibi],
        [64, 128],
        ["64 (1×)", "128 (2×)"],
        ppl_values,
        baseline=find_baseline([rope, alibi], "rope"),
    )
    text = "\n".join(lines)
    assert "| rope | baseline | baseline |" in text
    assert "| alibi | **+10.0% ± 0.0%** | **-45.0% ± 0.0%** |" in text  # the lowest at 2x is still paired with rope
    assert "value / the baseline's (rope) value − 1" in text
    assert (
        lines[-1]
        == "- 128 (2×): baseline rope; interval excludes 0 (clearly different): alibi; interval includes 0: no setting"
    )
    with pytest.raises(
        PosGPTError, match=r"--baseline 'xpos' is not a setting of these runs; they are: 'rope', 'alibi'"
    ):
        find_baseline([rope, alibi], "xpos")
    with pytest.raises(PosGPTError, match="has one seed"):
        find_baseline([entry("t5", {64: {1: 9.0}})], "t5")


@pytest.mark.slow
@pytest.mark.e2e
def test_compare_baseline_through_the_command_line(study, tmp_path, capsys):
    _, study_dir, *_ = study
    runs = [str(study_dir / f"rope-s{seed}") for seed in (1, 2)]  # settings: rope, and rope yarn:4
    md = tmp_path / "c.md"
    compare.main(runs + ["--baseline", "rope yarn:4", "--markdown", str(md), "--plot", str(tmp_path / "c.png")])
    report = md.read_text()
    assert "| rope yarn:4 | baseline |" in report and "(1×): baseline rope yarn:4; interval" in report
    with pytest.raises(SystemExit) as exit_info:
        compare.main(
            runs + ["--baseline", "nope", "--markdown", str(tmp_path / "d.md"), "--plot", str(tmp_path / "d.png")]
        )
    assert exit_info.value.code == 2 and "--baseline 'nope' is not a setting" in capsys.readouterr().err
    assert not (tmp_path / "d.md").exists()


def test_export_refuses_two_runs_of_one_name(cli, tmp_path):
    """They would land in one folder: refused with one line, before anything is read or written."""
    runs = [tmp_path / "a" / "rope-s1", tmp_path / "b" / "rope-s1"]
    done = export(cli, *runs, "--to", tmp_path / "exported")
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0, done.stderr
    assert "several runs are named rope-s1: export them into separate folders" in done.stderr
    assert not (tmp_path / "exported").exists()


def test_seeds_of_one_setting_share_one_typing_and_keep_their_own_seed():
    """reports.runs.typed_config types a setting once for all its seeds: each still reads its own seed, a config
    without one reads the schema's default (not a cached seed), and the result is trained_config's."""
    saved = OmegaConf.to_container(compose_config(["pe=rope", "train.seed=7"]), resolve=True)
    other_seed = {**saved, "train": {**saved["train"], "seed": 8}}
    no_seed = {**saved, "train": {k: v for k, v in saved["train"].items() if k != "seed"}}

    def typed(config):
        return typed_config(config, trained_config)

    for config in (saved, other_seed, no_seed, saved):
        assert typed(config) == OmegaConf.to_container(trained_config(config), resolve=True)
    assert [typed(c)["train"]["seed"] for c in (saved, other_seed, no_seed)] == [7, 8, TrainConfig().seed]
    typed(saved)["train"]["seed"] = 99  # a caller's change reaches no other run
    assert (
        typed_config(other_seed, trained_config)["train"]["seed"] == 8
        and typed_config(saved, trained_config)["train"]["seed"] == 7
    )


@pytest.mark.slow
def test_the_seeds_of_a_fine_tuning_are_one_setting_whatever_their_parents_paths(cli, tmp_path):
    """Each seed of a fine-tuning starts from its own parent's directory (train.init_from): the seeds are one
    setting when their parents are (read from the parents' results, or, where those are not at the recorded path, from
    what each run recorded of its parent when it started), and two parents of other settings stay apart."""
    parents = [make_run(tmp_path / f"parent-s{seed}", cli.corpus, "pe=rope", f"train.seed={seed}") for seed in (1, 2)]
    runs = []
    for seed, parent in zip((1, 2), parents):
        assert cli.eval_here(parent, "eval.lengths=[16]", "eval.protocols=[nonoverlapping]").returncode == 0
        child = make_run(
            tmp_path / f"child-s{seed}", cli.corpus, "pe=rope", f"train.seed={seed}", f"train.init_from={parent}"
        )
        assert cli.eval_here(child, "eval.lengths=[16]", "eval.protocols=[nonoverlapping]").returncode == 0
        record = {"step": 0, "init_from": str(parent), "parent_step": 0, "parent_seq_len": 16, "parent_pe": "rope"}
        (child / "metrics.jsonl").write_text(json.dumps(record) + "\n")
        runs.append(child)
    assert [len(group) for group in group_by_seed(load_runs(runs, trained_config))] == [2]
    for parent in parents:  # results exported without their parents: what each run recorded of its parent
        shutil.move(parent, tmp_path / "moved" / parent.name)
    assert [len(group) for group in group_by_seed(load_runs(runs, trained_config))] == [2]
    other = json.loads((runs[1] / "metrics.jsonl").read_text()) | {"parent_step": 500}
    (runs[1] / "metrics.jsonl").write_text(json.dumps(other) + "\n")
    assert [len(group) for group in group_by_seed(load_runs(runs, trained_config))] == [1, 1]
