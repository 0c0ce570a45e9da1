"""Compare how several runs extrapolate: one markdown table and one perplexity-vs-length plot.

    python scripts/compare.py multirun/study/*-*/                      # -> comparison.md, comparison.png
    python scripts/compare.py run_a run_b --protocol sliding --markdown out.md --plot out.png
    python scripts/compare.py runs/*/ --per-position per_position.png  # loss by position, one line per run
    python scripts/compare.py runs/*/ --entropy entropy.png            # attention entropy (inspect_attention.py)

Reads each run's <run_dir>/eval/extrapolation.json (written by the eval at the end of training and by
eval.py). Table rows: one per run and RoPE scaling ("rope", "rope yarn:16", "alibi"); columns: evaluation
lengths; cells: perplexity, the best of each column in bold; "n/a" where the scheme cannot run at that
length (learned beyond its table), "-" where it was not evaluated. Below the table: the protocol, the data
and the scored token ranges; cells scored on different tokens are flagged, since they are not comparable.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.cli import exit_on_user_error  # noqa: E402
from core.errors import PosGPTError  # noqa: E402
from evaluation.attention_stats import plot_entropy_comparison, read_attention  # noqa: E402
from evaluation.extrapolation import PROTOCOLS, effective_stride  # noqa: E402
from evaluation.plots import plot_per_position, plot_ppl_vs_length  # noqa: E402
from evaluation.report import format_ppl, read_results  # noqa: E402
from evaluation.run import EVAL_DIR  # noqa: E402
from model.pe.rope_scaling import scaling_label  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path, help="training run directories")
    parser.add_argument("--protocol", choices=PROTOCOLS, default="nonoverlapping")
    parser.add_argument("--stride", type=int, default=None,
                        help="sliding protocol: the stride evaluated (default: half of each length, eval's default)")
    parser.add_argument("--data", default=None, help="compare results on this data (default: the only one)")
    parser.add_argument("--markdown", type=Path, default=Path("comparison.md"), help="table output path")
    parser.add_argument("--plot", type=Path, default=Path("comparison.png"), help="plot output path")
    parser.add_argument("--per-position", type=Path, default=None,
                        help="also plot loss by position at the longest evaluated length to this path")
    parser.add_argument("--entropy", type=Path, default=None,
                        help="also overlay the runs' attention entropy by position (eval/attention.json, written "
                             "by scripts/inspect_attention.py), one colour per scheme, to this path")
    return parser.parse_args(argv)


def load_documents(run_dirs: list[Path]) -> list[dict[str, Any]]:
    documents = []
    for run_dir in run_dirs:
        document = read_results(run_dir / EVAL_DIR)
        if document is None:
            raise PosGPTError(f"{run_dir} has no {EVAL_DIR}/extrapolation.json; run python eval.py run_dir={run_dir}")
        documents.append(document)
    return documents


def choose_data(documents: list[dict[str, Any]], data: str | None) -> str:
    available = sorted({str(row.get("data")) for document in documents for row in document["results"]})
    if data is None and len(available) == 1:
        return available[0]
    if data not in available:
        raise PosGPTError(f"choose the data to compare with --data (results exist for {', '.join(available)})")
    return data


def series(run_dirs: list[Path], documents: list[dict[str, Any]], protocol: str, stride: int | None,
           data: str) -> list[dict[str, Any]]:
    """One entry per (run, scaling): its label, training length and {length: row} for the chosen setting."""
    entries = []
    for run_dir, document in zip(run_dirs, documents):
        by_scaling: dict[str, dict[int, dict[str, Any]]] = {}
        for row in document["results"]:
            wanted_stride = effective_stride(row["length"], stride) if protocol == "sliding" else None
            if row["protocol"] == protocol and row["stride"] == wanted_stride and str(row.get("data")) == data:
                by_scaling.setdefault(scaling_label(row.get("scaling")), {})[row["length"]] = row
        if not by_scaling:  # shown as a row of "-" rather than silently left out
            by_scaling[""] = {}
        for scaling, rows in sorted(by_scaling.items(), key=lambda item: (item[0] not in ("", "none"), item[0])):
            scheme = "none (NoPE)" if document["pe"] == "none" else document["pe"]  # not "no scaling"
            label = scheme + ("" if scaling in ("", "none") else f" {scaling}")
            entries.append({"label": label, "run": run_dir, "train_len": document["train_seq_len"], "rows": rows})
    if not any(entry["rows"] for entry in entries):
        raise PosGPTError(f"no {protocol} results on data {data} in these runs (try --protocol or --stride)")
    duplicated = Counter(entry["label"] for entry in entries)
    for entry in entries:
        if duplicated[entry["label"]] > 1:  # two runs of one scheme: tell them apart by directory
            entry["label"] += f" ({entry['run'].resolve().name})"
    return entries


def markdown_table(entries: list[dict[str, Any]], protocol: str, stride: int | None, data: str) -> str:
    lengths = sorted({length for entry in entries for length in entry["rows"]})
    train_lens = {entry["train_len"] for entry in entries}
    common_train_len = next(iter(train_lens)) if len(train_lens) == 1 else None
    header = ["scheme"] + [f"{L}" + (f" ({L / common_train_len:g}×)" if common_train_len else "") for L in lengths]
    if common_train_len is None:
        header.insert(1, "train length")
    best = {L: min((e["rows"][L]["ppl"] for e in entries if L in e["rows"] and e["rows"][L]["ppl"] is not None),
                   default=None) for L in lengths}
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" + "---:|" * (len(header) - 1)]
    for entry in entries:
        cells = [entry["label"]] + ([str(entry["train_len"])] if common_train_len is None else [])
        for L in lengths:
            row = entry["rows"].get(L)
            cell = "-" if row is None else format_ppl(row["ppl"])
            is_best = row is not None and row["ppl"] is not None and row["ppl"] == best[L]
            cells.append(f"**{cell}**" if is_best else cell)
        lines.append("| " + " | ".join(cells) + " |")
    stride_note = f", stride {stride or 'L/2'}" if protocol == "sliding" else ""
    ranges = {tuple(row["target_range"]) + (row["tokens"],) for e in entries for row in e["rows"].values()
              if row["ppl"] is not None}
    if len(ranges) == 1:
        start, stop, tokens = next(iter(ranges))
        tokens_note = f"every cell scores the same {tokens:,} tokens (targets [{start:,}, {stop:,}) of the split)"
    else:
        tokens_note = ("**cells scored different token ranges** "
                       f"({', '.join(f'[{a:,}, {b:,})' for a, b, _ in sorted(ranges))}): compare with care")
    return "\n".join([
        f"Perplexity by evaluation length ({protocol} protocol{stride_note}; data: {data}; "
        f"training length {common_train_len or 'per row'}). n/a: not evaluable there (the run's "
        "extrapolation.json says why).",
        "",
        *lines,
        "",
        f"Scored tokens: {tokens_note}.",
    ]) + "\n"


def longest_evaluated_length(entries: list[dict[str, Any]]) -> int | None:
    """The longest length any entry has a perplexity at (entries that cannot run there are left out)."""
    lengths = sorted({L for entry in entries for L, row in entry["rows"].items() if row["ppl"] is not None})
    return lengths[-1] if lengths else None


@exit_on_user_error
def main(argv: list[str]) -> None:
    args = parse_args(argv)
    documents = load_documents(args.run_dirs)
    data = choose_data(documents, args.data)
    entries = series(args.run_dirs, documents, args.protocol, args.stride, data)
    table = markdown_table(entries, args.protocol, args.stride, data)
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(table)
    print(table)
    train_lens = {entry["train_len"] for entry in entries}
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    plot_ppl_vs_length([(e["label"], [(L, row["ppl"]) for L, row in e["rows"].items()]) for e in entries],
                       train_lens, args.plot, f"Length extrapolation ({args.protocol}, {data})")
    written = [args.markdown, args.plot]
    if args.per_position is not None:
        length = longest_evaluated_length(entries)
        curves = [(e["label"], e["rows"][length]["per_position_loss"]) for e in entries
                  if length in e["rows"] and e["rows"][length]["ppl"] is not None]
        args.per_position.parent.mkdir(parents=True, exist_ok=True)
        plot_per_position(curves, train_lens, args.per_position,
                          f"Loss by position in windows of {length} ({args.protocol}, {data})")
        written.append(args.per_position)
    if args.entropy is not None:
        args.entropy.parent.mkdir(parents=True, exist_ok=True)
        plot_entropy_comparison(read_attention(args.run_dirs), args.entropy)
        written.append(args.entropy)
    print(f"compare: wrote {', '.join(map(str, written))}")


if __name__ == "__main__":
    main(sys.argv[1:])
