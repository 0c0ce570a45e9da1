"""Every committed comparison under results/ is what scripts/compare.py writes from the raw results beside it, and
every table the README, docs/results.md and docs/fine-tuning.md quote from one is that report's, to the printed
digit: both are rebuilt by scripts/rebuild_reports.py from results/reports.json (each recipe: the runs and options of
one report)."""

import re
from pathlib import Path

import pytest
import rebuild_reports
from repo_root import REPO

from core.errors import PosGPTError

RESULTS = REPO / "results"
RECIPES = rebuild_reports.load_registry()
# One text study (perplexity, ratios, paired, language runs) and one task study (accuracy tables): a few seconds.
SAMPLE = ["shakespeare-width64/comparison.md", "pope-mqar-budget/comparison_tasks.md"]


def recipe(report: str) -> rebuild_reports.Recipe:
    return next(recipe for recipe in RECIPES if recipe.report == report)


def test_every_committed_report_is_listed():
    assert sorted(str(path.relative_to(RESULTS)) for path in RESULTS.glob("*/comparison*.md")) == sorted(
        recipe.report for recipe in RECIPES
    )


@pytest.mark.parametrize("report", SAMPLE)
def test_a_sample_of_reports_rebuilds_from_its_raw_results(report, tmp_path):
    assert rebuild_reports.rebuild_report(recipe(report), tmp_path) == (RESULTS / report).read_text()


@pytest.mark.slow
@pytest.mark.parametrize("report", [recipe.report for recipe in RECIPES if recipe.report not in SAMPLE])
def test_a_committed_report_reproduces_from_its_raw_results(report, tmp_path):
    assert rebuild_reports.rebuild_report(recipe(report), tmp_path) == (RESULTS / report).read_text()


@pytest.mark.parametrize("page", rebuild_reports.DOCS)
def test_every_quoted_table_is_its_report_to_the_printed_digit(page):
    """Each marked block of the pages (rebuild_reports.DOCS), rebuilt from the committed report it names, is the
    committed text: no interval in them was copied wrong or left behind when a report changed."""
    text, stale = rebuild_reports.rebuilt_doc(REPO / page)
    assert stale == []
    assert text == (REPO / page).read_text()
    assert text.count("<!-- table:") >= 1


# Intervals the docs print that no committed report prints as such: a report's three decimals rounded to two in
# the prose (+0.73 ± 0.40 for +0.732 ± 0.397), or computed outside compare.py's reports (against another baseline,
# over a subset of seeds, validation losses' differences), each explained where it is printed.
COMPUTED_ELSEWHERE = {
    "+0.73 ± 0.40", "+0.20 ± 0.09", "+0.11 ± 0.07", "+0.84 ± 0.22", "+0.76 ± 0.28", "+0.81 ± 0.12", "−0.27 ± 0.19",
    "+0.31 ± 0.25", "+0.04 ± 0.08", "−0.01 ± 0.10", "+5.4% ± 1.1%", "−0.8% ± 2.2%", "11.6% ± 3.2%",
    "+19.6% ± 9.1%", "+0.070 ± 0.038", "+0.063 ± 0.025", "+0.090 ± 0.042", "+0.125 ± 0.065", "+0.082 ± 0.038",
    "+0.043 ± 0.028", "+0.024 ± 0.029",
}  # fmt: skip
INTERVAL = re.compile(r"[+\-−]?\d[\d,]*(?:\.\d+)?%? ± \d[\d,]*(?:\.\d+)?%?")


def test_every_interval_in_the_prose_is_printed_by_a_committed_report():
    """Outside the marked tables too: each ``mean ± half-width`` of those pages occurs, digit for
    digit, in a committed report or study README (a weaker check than the tables': it finds the text, not its
    row), but for the few computed elsewhere."""
    printed = "\n".join(path.read_text() for path in RESULTS.glob("**/*.md")).replace("−", "-")
    missing = {
        interval
        for page in rebuild_reports.DOCS
        for interval in INTERVAL.findall((REPO / page).read_text())
        if interval.replace("−", "-") not in printed
    }
    assert sorted(missing - COMPUTED_ELSEWHERE) == []  # a new interval no report prints: quote it from one
    assert sorted(COMPUTED_ELSEWHERE - missing) == []  # gone from the docs, or now printed by a report


def marked_page(tmp_path: Path, spec: str, body: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(f"Before.\n\n<!-- table: {spec} -->\n{body}<!-- /table -->\n\nAfter.\n")
    return page


def test_a_stale_block_is_listed_by_check_and_rewritten_without_it(tmp_path, capsys):
    source = (RESULTS / "shakespeare-width64/comparison.md").read_text()
    committed = source.split("\n\n")[1] + "\n\n"  # the perplexity table, a blank line ending it
    spec = "results/shakespeare-width64/comparison.md\ntable: 1"
    page = marked_page(tmp_path, spec, committed.replace("5", "6"))
    with pytest.raises(SystemExit) as exited:
        rebuild_reports.main(["--check", "--docs-only", str(page)])
    assert exited.value.code == 1
    assert f"stale: {page}:3" in capsys.readouterr().out
    rebuild_reports.main(["--docs-only", str(page)])
    assert page.read_text() == marked_page(tmp_path / "..", spec, committed).read_text()
    rebuild_reports.main(["--check", "--docs-only", str(page)])  # now current: exits 0


def test_a_selection_renames_picks_tables_and_typesets(tmp_path):
    spec = """results/study-width256/comparison_vs_rope.md
columns: scheme = setting | 16× = 1024 (16×) | paired at 16× = 1024 (16×) @2
rows: ALiBi = alibi | learned | FoX = FoX @ results/copy-probe-study/comparison_vs_rope.md
main-bold: 16×
minus: −
dash: n/a"""
    text, stale = rebuild_reports.rebuilt_doc(marked_page(tmp_path, spec, ""))
    assert stale == [f"{tmp_path / 'page.md'}:3"]
    assert text.split("-->\n")[1].split("<!--")[0] == (
        "| scheme | 16× | paired at 16× |\n|---|---:|---:|\n"
        "| ALiBi | **11.71 ± 1.77** | **−30.8% ± 25.7%** |\n"  # bold: the lowest of the marker's report
        "| learned | n/a | n/a |\n"  # paired: "-" in the report
        "| FoX | 11.05 ± 1.09 | **−34.8% ± 21.8%** |\n\n"  # its report's lowest, not bold here (main-bold)
    )


def test_a_marker_left_open_is_refused(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- table: results/study-width256/comparison.md -->\n| a |\n")
    with pytest.raises(PosGPTError, match="has no '<!-- /table -->' after it"):
        rebuild_reports.rebuilt_doc(page)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("results/no-such-study/comparison.md", "names results/no-such-study/comparison.md, which is not a file"),
        ("results/study-width256/comparison.md\ncolour: red", "'colour: red' in a table marker is not a key"),
        ("results/study-width256/comparison.md\ntable: 9", "table 9 asked of results/study-width256/comparison.md"),
        ("results/study-width256/comparison.md\nrows: rope | nope", "no row 'nope' in table 1"),
        ("results/study-width256/comparison.md\nsection: Task: copy", "0 sections start with 'Task: copy'"),
        ("results/study-width256/comparison.md\nrows: FoX @ results/missing.md", "names results/missing.md"),
    ],
)
def test_a_bad_marker_is_refused_in_one_line(spec, message, tmp_path, capsys):
    page = marked_page(tmp_path, spec, "")
    with pytest.raises(PosGPTError, match=re.escape(message)):
        rebuild_reports.rebuilt_doc(page)
    with pytest.raises(SystemExit) as exited:
        rebuild_reports.main(["--check", "--docs-only", str(page)])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err.startswith(f"error: {page}:3: ") and err.count("\n") == 1, err
