"""Result rows are keyed by what they scored (corpus content, split, targets) and what computed them (attention
backend, dtype): eval.py replaces only rows of the same measurement and says so; compare.py pools as seeds
only rows of one identity, labels the others, and reads results written before identities were recorded."""

import json

import pytest
from result_runs import STDLIB, corpus, corpus_splits, evaluate, fake_run  # noqa: F401

from core.tracking import read_metrics
from evaluation.perplexity_format import PERPLEXITY_ROWS
from evaluation.render import format_table
from evaluation.results import group_by_scored, scored_identity
from evaluation.run import EVAL_DIR
from evaluation.stats import Estimate
from reports.curves import ValidationCurve, training_runtime_note, validation_report
from reports.perplexity import entries_of, markdown_report, ppl_estimate
from reports.runs import group_by_seed

IDENTITY = ("split_digest", "attn_backend", "dtype")


@pytest.fixture(scope="module")
def other_corpus(tmp_path_factory):
    return corpus_splits(tmp_path_factory, "heapq.py", "glob.py", "fnmatch.py")


def test_rows_record_what_they_scored_and_what_computed_them(corpus, tmp_path):  # noqa: F811
    document = evaluate(corpus["val"], tmp_path)
    for row in document["results"]:
        assert row["split"] == "val" and row["split_digest"] == corpus["val"].digest and len(row["split_digest"]) == 64
        assert row["attn_backend"] == "sdpa" and row["dtype"] == "float32"  # RoPE on CPU, backend auto
    assert corpus["val"].digest != corpus["train"].digest


def test_rows_record_the_weights_step_scheme_seed_evaluator_and_count_that_scored_them(corpus, tmp_path):  # noqa: F811
    """Every row carries its provenance: the digest of the weights that scored it (another model: another digest,
    the same weights again: the same), the step, the scheme, the training seed, the evaluator and the settings of
    it that the row depends on, and how many tokens it scored."""
    document = evaluate(corpus["val"], tmp_path / "a")
    digests = {row["weights"] for row in document["results"]}
    assert len(digests) == 1 and len(next(iter(digests))) == 16
    for row in document["results"]:
        assert (row["step"], row["scheme"], row["train_seed"], row["evaluator"]) == (5, "rope", 1337, "perplexity")
        assert row["evaluator_settings"] == {"max_tokens": 64, "batch_tokens": 16384}
        assert row["scored"] == row["tokens"] > 0 and row["scored_unit"] == "tokens"
    again = evaluate(corpus["val"], tmp_path / "b")
    assert {row["weights"] for row in again["results"]} == digests  # the same weights: the same identity
    changed = evaluate(corpus["val"], tmp_path / "c", prepare=lambda model: model.token_embedding.weight.data.mul_(2))
    assert {row["weights"] for row in changed["results"]}.isdisjoint(digests)


def test_another_corpus_or_split_under_the_same_name_never_replaces_rows(corpus, other_corpus, tmp_path, capsys):  # noqa: F811
    """The bug: a second file under the same data.name replaced the run's validation rows."""
    first = evaluate(corpus["val"], tmp_path)["results"]
    capsys.readouterr()
    for tokens in (other_corpus["val"], corpus["train"]):
        evaluate(tokens, tmp_path)
    assert "replaced" not in capsys.readouterr().out
    document = json.loads((tmp_path / EVAL_DIR / "extrapolation.json").read_text())
    assert len(document["results"]) == 3 * len(first)
    kept = [row for row in document["results"] if row["split_digest"] == corpus["val"].digest]
    assert [(row["length"], row["ppl"]) for row in kept] == [(row["length"], row["ppl"]) for row in first]
    table = format_table(document, PERPLEXITY_ROWS).splitlines()
    labels = [line.split("  ")[0] for line in table[1:4]]
    assert len(set(labels)) == 3 and all(label.startswith("nonoverlapping [corpus ") for label in labels)
    assert any("split train" in label for label in labels) and "[...] says what differs" in table[-1]

    evaluate(corpus["val"], tmp_path)  # the same measurement again: replaced, and said in one line
    printed = [line for line in capsys.readouterr().out.splitlines() if "replaced" in line]
    assert printed == [
        f"eval: replaced 2 earlier rows of the same measurement (data tiny, corpus {corpus['val'].digest[:10]}, "
        "split val, the same targets, backend, dtype and settings; lengths 8, 16)"
    ]
    assert len(json.loads((tmp_path / EVAL_DIR / "extrapolation.json").read_text())["results"]) == 3 * len(first)


def test_rows_without_a_recorded_identity_are_kept_beside_new_ones(corpus, tmp_path, capsys):  # noqa: F811
    """Rows from before identities were recorded may be of any corpus: never replaced, shown apart."""
    evaluate(corpus["val"], tmp_path)
    path = tmp_path / EVAL_DIR / "extrapolation.json"
    document = json.loads(path.read_text())
    for row in document["results"]:
        for key in IDENTITY:
            del row[key]
    path.write_text(json.dumps(document))
    capsys.readouterr()
    document = evaluate(corpus["val"], tmp_path)
    assert "replaced" not in capsys.readouterr().out and len(document["results"]) == 4
    assert "nonoverlapping [corpus unrecorded (the standard library of this Python) backend unrecorded" in format_table(
        document, PERPLEXITY_ROWS
    )


def test_a_row_that_scored_nothing_joins_every_group_of_its_split():
    def row(length, digest="a", targets=(16, 80), split="val"):
        return {"length": length, "split_digest": digest, "split": split, "target_range": targets}

    rows = [row(16), row(16, targets=(32, 96)), row(64, targets=None), row(64, digest="b", targets=None)]
    groups = group_by_scored(rows)
    assert [[r["length"] for r in members] for members in groups.values()] == [[16, 64], [16, 64], [64]]
    assert list(groups)[2] == scored_identity(rows[3])  # another corpus: a group of its own


def entries(runs):
    return entries_of(group_by_seed(runs), "nonoverlapping", None, "d")


def table_row(report, label):
    line = next(line for line in report.splitlines() if line.startswith(f"| {label} |"))
    return [cell.strip() for cell in line.strip("|").split("|")][1:]


def test_compare_pools_seeds_only_over_rows_of_one_corpus_split_and_targets():
    runs = [fake_run("rope", 1, 10.0), fake_run("rope", 2, 12.0), fake_run("rope", 3, 50.0, digest="b" * 64)]
    rope_a, rope_b = entries(runs)
    assert (rope_a.label, rope_a.seeds, rope_b.label, rope_b.seeds) == (
        "rope [corpus aaaaaaaaaa]",
        [1, 2],
        "rope [corpus bbbbbbbbbb]",
        [3],
    )
    assert ppl_estimate(rope_a, 16).mean == 11.0  # seed 3 is not averaged in
    for changed, tag in (({"split": "all"}, "split all"), ({"targets": (128, 192)}, "targets [128, 192)")):
        labels = [entry.label for entry in entries([fake_run("rope", 1, 10.0), fake_run("rope", 2, 12.0, **changed)])]
        assert labels[1] == f"rope [{tag}]" and len(labels) == 2
    report = markdown_report(entries(runs), "nonoverlapping", None, "d", ratios=False)
    assert "**rows marked [...] scored other tokens**" in report
    assert table_row(report, "rope [corpus aaaaaaaaaa]")[0] == "2"


def test_compare_never_pools_unrecorded_rows_with_recorded_ones_but_pools_them_with_each_other():
    unrecorded = [
        fake_run("rope", seed, ppl, digest=None, backend=None, dtype=None) for seed, ppl in ((1, 10.0), (2, 12.0))
    ]
    (entry,) = entries(unrecorded)  # a study written before identities were recorded: as before
    assert entry.label == "rope" and entry.seeds == [1, 2]
    mixed = entries([unrecorded[0], fake_run("rope", 2, 12.0)])
    assert [entry.label for entry in mixed] == [
        "rope [corpus unrecorded (files d.txt) backend unrecorded dtype unrecorded]",
        "rope [corpus aaaaaaaaaa sdpa float32]",
    ]


def test_compare_keeps_a_settings_seeds_of_another_backend_or_dtype_apart_and_names_backends_across_settings():
    runs = [fake_run("rope", 1, 10.0), fake_run("rope", 2, 12.0, backend="math", dtype="bfloat16")]
    assert [entry.label for entry in entries(runs)] == ["rope [sdpa float32]", "rope [math bfloat16]"]
    # across settings a different backend is the default (flex for ALiBi on a GPU): noted, no label, compared
    runs = [fake_run("rope", s, 10.0 + s) for s in (1, 2)] + [
        fake_run("alibi", s, 11.0 + s, "a" * 64, "flex") for s in (1, 2)
    ]
    found = entries(runs)
    assert [entry.label for entry in found] == ["rope", "alibi"]
    report = markdown_report(found, "nonoverlapping", None, "d", ratios=False)
    assert "Attention backend and dtype: sdpa, float32 (rope); flex, float32 (alibi)." in report
    assert "- 16 (1×): lowest rope; intervals apart (clearly worse): no setting" in report


def test_compare_claims_differences_only_between_rows_that_scored_the_same_tokens():
    runs = [fake_run("rope", s, 10.0 + s) for s in (1, 2)]
    runs += [fake_run("alibi", s, 20.0 + s, digest="b" * 64) for s in (1, 2)]
    runs += [fake_run("t5", s, 30.0 + s, digest="b" * 64) for s in (1, 2)]
    report = markdown_report(entries(runs), "nonoverlapping", None, "d", ratios=False)
    assert "**rows marked [...] scored other tokens**" in report
    assert "Among the rows that scored the tokens of alibi [corpus bbbbbbbbbb], t5 [corpus bbbbbbbbbb]:" in report
    assert "- 16 (1×): lowest alibi [corpus bbbbbbbbbb]; intervals apart (clearly worse): no setting" in report
    assert "| t5 [corpus bbbbbbbbbb] | **+46.5% ± 13.8%** |" in report  # paired with alibi, not with rope
    assert "Not compared (no other row scored their tokens): rope [corpus aaaaaaaaaa]." in report
    assert "lowest rope" not in report


def test_the_lowest_is_marked_only_among_rows_that_scored_the_same_tokens():
    """rope scored other tokens (on fewer, easier ones, say) than alibi and t5: its lower perplexity is the best of
    nothing, so it is not bold; alibi, the lowest of the two that scored the same tokens, is."""
    runs = [fake_run("rope", s, 5.0 + s, targets=(64, 96)) for s in (1, 2)]
    runs += [fake_run("alibi", s, 20.0 + s) for s in (1, 2)] + [fake_run("t5", s, 30.0 + s) for s in (1, 2)]
    report = markdown_report(entries(runs), "nonoverlapping", None, "d", ratios=False)
    assert table_row(report, "rope [targets [64, 96)]")[1] == "6.50 ± 6.35"
    alibi, t5 = table_row(report, "alibi [targets [64, 128)]"), table_row(report, "t5 [targets [64, 128)]")
    assert alibi[1] == "**21.50 ± 6.35**" and t5[1] == "31.50 ± 6.35"
    assert "the lowest is marked, and differences are claimed, only among rows that scored the same tokens" in report
    alone = markdown_report(entries(runs[:2]), "nonoverlapping", None, "d", ratios=False)
    assert table_row(alone, "rope")[1] == "**6.50 ± 6.35**"  # one class: its best is marked as ever


def test_rows_of_an_earlier_checkpoint_than_the_runs_last_are_named_so():
    """A run trained on after it was evaluated: its rows scored step 10, its last checkpoint is of step 20, whose
    config (resumed with other settings) did not score them; the label says so, and the config is the rows'."""
    runs = [fake_run("rope", s, 10.0 + s) for s in (1, 2)] + [fake_run("alibi", s, 11.0 + s) for s in (1, 2)]
    runs[0].latest_step, runs[3].latest_step = 10, 20
    assert [entry.label for entry in entries(runs)] == ["rope", "alibi [step 10, not the last: 20]"]


# Old studies (rows without digest, backend or dtype) reproducing their tables: tests/docs/test_results.py.


@pytest.mark.slow
def test_train_records_its_backend_and_eval_of_another_corpus_keeps_the_validation_rows(cli, tmp_path):
    """Through train.py and eval.py as a command line runs them (in this process): metrics.jsonl names the backend
    and dtype; eval.py of another file under the training data's name adds rows beside the validation rows, and
    scoring the same again replaces them."""
    run_dir = tmp_path / "run"
    lengths = ["eval.length_multipliers=[1,2]", "eval.protocols=[nonoverlapping]", "eval.max_tokens=256"]
    done = cli.train_here(run_dir, "train.max_steps=2", "train.eval_after=true", *lengths)
    assert done.returncode == 0, done.stderr
    assert "attn_backend=sdpa" in done.stdout
    assert {"step": 0, "attn_backend": "sdpa", "dtype": "float32"} in read_metrics(run_dir)
    path = run_dir / EVAL_DIR / "extrapolation.json"
    validation = json.loads(path.read_text())["results"]
    assert {(row["split"], row["attn_backend"], row["dtype"]) for row in validation} == {("val", "sdpa", "float32")}
    other = tmp_path / "other.txt"
    other.write_text((STDLIB / "difflib.py").read_text()[:20_000])
    done = cli.eval_here(run_dir, f"data.files=[{other}]", "logging.progress=false")  # data.name is still "text"
    assert done.returncode == 0, done.stderr
    assert "replaced" not in done.stdout
    rows = json.loads(path.read_text())["results"]
    assert [row for row in rows if row["split"] == "val"] == validation and len(rows) == 2 * len(validation)
    done = cli.eval_here(run_dir, f"data.files=[{other}]", "logging.progress=false")
    assert "eval: replaced 2 earlier rows of the same measurement (data text" in done.stdout


def test_compare_val_curve_names_the_backends_and_dtypes_runs_trained_with():
    def curve(label, *runtimes):
        return ValidationCurve(label, label, 2, {10: Estimate(3.0, 0.1, 2)}, list(runtimes))

    assert training_runtime_note([curve("rope"), curve("alibi")]) == []  # not recorded (older runs)
    same = validation_report([curve("rope", "sdpa, float32"), curve("alibi", "sdpa, float32")])
    assert "Trained with attention backend and dtype sdpa, float32 (every run that records it)." in same
    mixed = validation_report([curve("rope", "sdpa, float32", "sdpa, bfloat16"), curve("alibi", "flex, float32")])
    assert (
        "Trained with attention backend and dtype: rope: sdpa, float32 / sdpa, bfloat16 (its seeds differ: pooled "
        "above); alibi: flex, float32." in mixed
    )
