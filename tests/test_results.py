"""Every committed comparison under results/ is what scripts/compare.py writes from the raw results beside it, so
a table quoted in the docs can be redone from the repository alone (each study's README gives the command)."""

from pathlib import Path

import compare
import pytest

RESULTS = Path(__file__).resolve().parents[1] / "results"

# (the committed report, the run folders in the order compare.py was given them, its options)
REPORTS = [
    ("study-width256/comparison.md", ["study-width256/*/"], ["--ratios", "--val-curve", "v.png"]),
    ("width256-2025-schemes/comparison.md", ["width256-2025-schemes/*/"], ["--ratios"]),
    (
        "pope-mqar-budget/comparison_tasks.md",
        ["task-study-uniform/mqar-pope-s1/", "pope-mqar-budget/mqar-pope-s1-3000/", "task-study-uniform/mqar-rope-s1/"],
        [],
    ),
    (
        "document-aware-rope/comparison.md",
        ["document-aware-rope/rope-s*/", "width256-2025-schemes/rope-s*/"],
        ["--ratios", "--baseline", "rope data.document_aware=False", "--val-curve", "v.png"],
    ),
    ("study-width256/comparison_vs_rope.md", ["study-width256/*/"], ["--ratios", "--baseline", "rope"]),
    ("study-width64/comparison.md", ["study-width64/*/"], ["--ratios", "--val-curve", "v.png"]),
    ("rope-extensions/comparison_width64.md", ["rope-extensions/width64-*/"], ["--ratios", "--baseline", "rope"]),
    ("rope-extensions/comparison_width256.md", ["rope-extensions/width256-*/"], ["--ratios", "--baseline", "rope"]),
    (
        "rope-finetune/comparison.md",
        [f"rope-finetune/{name}/" for name in ("rope-64", "rope-256-plain", "rope-256-pi", "rope-256-yarn")],
        ["--ratios"],
    ),
    ("shakespeare-width64/comparison.md", ["shakespeare-width64/*/"], ["--ratios", "--data", "tinyshakespeare"]),
    (
        "shakespeare-probes/comparison.md",
        [f"shakespeare-probes/{probe}/*-s1/" for probe in ("h2", "w128", "s2400", "L256", "d6", "w256")],
        ["--ratios", "--data", "tinyshakespeare"],
    ),
    ("copy-probe-width256/comparison.md", ["copy-probe-width256/*/"], []),
    ("copy-probe-budget/comparison.md", ["copy-probe-budget/step_*/"], []),
    ("induction-budget-gpu/comparison.md", ["induction-budget-gpu/steps_*/"], []),
    ("copy-probe-study/comparison_vs_rope.md", ["copy-probe-study/*/"], ["--baseline", "rope", "--ratios"]),
    ("copy-probe-gpu/comparison_vs_rope.md", ["copy-probe-gpu/*/"], ["--baseline", "rope", "--ratios"]),
    ("induction-control/comparison.md", ["induction-control/rope-s1/", "induction-control/rope-gpt2-s1/"], []),
    ("width64-newer-schemes/comparison.md", ["width64-newer-schemes/*/"], ["--ratios", "--val-curve", "v.png"]),
    ("width64-newer-schemes/comparison_vs_rope.md", ["width64-newer-schemes/*/"], ["--ratios", "--baseline", "rope"]),
    (
        "width64-4layer-hybrids/comparison_vs_rope.md",
        ["width64-4layer-hybrids/*/"],
        ["--baseline", "rope", "--ratios"],
    ),
    ("task-study/comparison_tasks.md", ["task-study/*/"], []),
    (
        "width64-4layer-attention/comparison_vs_rope.md",
        ["width64-4layer-attention/*/"],
        ["--baseline", "rope", "--ratios", "--val-curve", "v.png"],
    ),
    (
        "width64-4layer-attention/comparison_sliding.md",
        ["width64-4layer-attention/rope-s[0-9]/", "width64-4layer-attention/rope-sink-s[0-9]/"],
        ["--protocol", "sliding", "--baseline", "rope model.attn_sink=False", "--ratios"],
    ),
    (
        "width64-4layer-attention/comparison_streaming.md",
        ["width64-4layer-attention/rope-s[0-9]/", "width64-4layer-attention/rope-sink-s[0-9]/"],
        ["--protocol", "streaming", "--baseline", "rope model.attn_sink=False k=4"],
    ),
    ("task-attention/comparison_tasks_vs_rope.md", ["task-attention/*/"], ["--baseline", "rope"]),
    ("task-4layer-hybrids/comparison_tasks_vs_rope.md", ["task-4layer-hybrids/*/"], ["--baseline", "rope"]),
    (
        "task-4layer-hybrids-uniform/comparison_tasks_vs_rope.md",
        ["task-4layer-hybrids-uniform/*/"],
        ["--baseline", "rope pe.base=10000.0"],
    ),
    ("task-study/comparison_tasks_vs_rope.md", ["task-study/*/"], ["--baseline", "rope"]),
    ("task-study-gpu/comparison_tasks.md", ["task-study-gpu/*/"], []),
    ("task-study-uniform/comparison_tasks.md", ["task-study-uniform/*/"], []),
    ("ruler-defaults/comparison_tasks.md", ["ruler-defaults/*/"], []),
    (
        "task-randpos/comparison_rope.md",
        [
            "task-study-uniform/passkey-rope-s*/",
            "task-study-uniform/flipflop-rope-s*/",
            "task-study-uniform/copy-rope-s*/",
            "task-randpos/*-rope-s*/",
        ],
        ["--baseline", "rope train.random_positions=None"],
    ),
    (
        "task-randpos/comparison_sinusoidal.md",
        [
            "task-study-uniform/passkey-sinusoidal-s*/",
            "task-study-uniform/flipflop-sinusoidal-s*/",
            "task-study-uniform/copy-sinusoidal-s*/",
            "task-randpos/*-sinusoidal-s*/",
        ],
        ["--baseline", "sinusoidal train.random_positions=None"],
    ),
    ("task-study-gpu/comparison_tasks_vs_rope.md", ["task-study-gpu/*/"], ["--baseline", "rope"]),
    (
        "shakespeare-probes/comparison_width256.md",
        ["shakespeare-probes/w256/*/"],
        ["--ratios", "--data", "tinyshakespeare"],
    ),
]


def test_every_committed_report_is_listed():
    assert sorted(str(path.relative_to(RESULTS)) for path in RESULTS.glob("*/comparison*.md")) == sorted(
        report for report, _, _ in REPORTS
    )


@pytest.mark.slow
@pytest.mark.parametrize("report, patterns, options", REPORTS, ids=[report for report, _, _ in REPORTS])
def test_a_committed_report_reproduces_from_its_raw_results(report, patterns, options, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative output paths (v.png) land here
    runs = [str(run) for pattern in patterns for run in sorted(RESULTS.glob(pattern))]
    assert runs, patterns
    compare.main([*runs, *options, "--markdown", "out.md", "--plot", "out.png"])
    assert (tmp_path / "out.md").read_text() == (RESULTS / report).read_text()
