"""Rebuild every committed report under results/ from its raw results, and every table the README,
docs/results.md and docs/fine-tuning.md quote from those reports (DOCS), and docs/design.md's map of the modules.

    python scripts/rebuild_reports.py              # rewrite the reports, their plots and the quoted tables
    python scripts/rebuild_reports.py --check      # write nothing; exit 1 naming each stale report or table
    python scripts/rebuild_reports.py --docs-only  # only the quoted tables, from the committed reports (seconds)

Reports. results/reports.json lists every committed results/<study>/comparison*.md with what scripts/compare.py
was given to write it: ``runs`` (glob patterns under results/, expanded and sorted in the order listed),
``options`` (compare.py's options that change the markdown) and ``outputs`` (an output option -> the file of the
study folder it writes, such as ``"--plot": "comparison.png"``; null where the option is needed for the markdown,
``--val-curve``'s table, but its plot is not committed). Each report is rebuilt by calling compare.py's ``main``
with its markdown and every output not committed sent to a scratch folder, so that only committed files change.

Quoted tables. In each page of DOCS a quoted block lies between two HTML comments, invisible on the
rendered page; the command rewrites what lies between them from the report the first names::

    <!-- table: results/task-study-uniform/comparison_tasks.md
    section: Task: passkey
    columns: passkey = setting | 1× = 64 (1×) | paired at 2× = 128 (2×) @2
    rows: RoPE = rope | ALiBi = alibi
      | KERPLE = kerple
    bold: none -->
    ...the block...
    <!-- /table -->

The first line names the source report; every other key is optional. ``section`` keeps the report's ``## ``
section whose heading starts so (``## Task: passkey (...)``); ``table`` the n-th table of it (from 1; default 1).
With neither ``columns`` nor ``rows`` the block is that table verbatim, or the whole report without ``table`` and
``section``. ``columns`` lists the block's columns, ``heading = source heading`` (or the source heading alone),
``@n`` taking the cell from the section's n-th table instead (paired differences beside perplexities); the
source's first column is the row's label. ``rows`` lists the rows, ``label = source label`` (or the label
alone), ``@ path`` taking the row from another report of the same layout. Each cell is copied as the report prints
it, but: ``bold: none`` drops every cell's bold; ``plain: heading | ...`` the bold of those columns (the report's
best may be a row the block leaves out); ``main-bold: heading | ...`` drops it in those columns for rows taken from
another report (the bold left marks the best of the marker's own report); ``minus: −`` prints a negative number's
sign as that character; ``dash: n/a`` prints a cell without a value (``-``) as that text. Values are separated by
`` | ``; a line not starting with a key continues the previous key's value.

The map of the modules. A marker whose source is ``modules`` (MODULES) holds no report's table but one generated
from the code: every module of the packages and scripts/, by path, with the first sentence of its docstring
(:func:`module_map`); tests/docs/test_docs_map.py fails when docs/design.md's block is stale.
"""

from __future__ import annotations

import _repo
from core.interrupts import unwind_on_sigterm

import argparse
import ast
import contextlib
import io
import json
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import compare
from tqdm.auto import tqdm

from core.cli import ArgumentParser, exit_on_user_error
from core.errors import PosGPTError
from core.files import atomic_write, read_user_text

ROOT = _repo.ROOT
RESULTS = ROOT / "results"
REGISTRY = RESULTS / "reports.json"
DOCS = ("README.md", "docs/results.md", "docs/fine-tuning.md", "docs/design.md")
MODULES = "modules"  # a marker's source that is no report: the map of the modules (module_map)
PACKAGES = ("core", "data", "model", "experiment", "training", "evaluation", "reports", "scripts")
# a marker is a comment opening a line: a page may mention one in its text
MARKER = re.compile(r"^<!-- table: (?P<spec>.*?)-->\n(?P<body>.*?)^<!-- /table -->", re.S | re.M)
OPENING = re.compile(r"^<!-- table:", re.M)
KEYS = ("section", "table", "columns", "rows", "bold", "plain", "main-bold", "minus", "dash")


@dataclass(frozen=True)
class Recipe:
    """How compare.py wrote one committed report: its path under results/, run patterns, options, outputs."""

    report: str
    runs: tuple[str, ...]
    options: tuple[str, ...]
    outputs: dict[str, str | None]


def load_registry(path: Path = REGISTRY) -> list[Recipe]:
    """The recipes of results/reports.json, one per committed report."""
    try:
        entries = json.loads(path.read_text())
        return [Recipe(e["report"], tuple(e["runs"]), tuple(e["options"]), dict(e["outputs"])) for e in entries]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise PosGPTError(f"{path}: not a list of report recipes ({error})") from None


def compare_argv(recipe: Recipe, markdown: Path, scratch: Path, write_plots: bool) -> list[str]:
    """compare.py's command line for ``recipe``: its runs expanded, its options, the markdown to ``markdown``, and
    each output to its committed file (``write_plots``) or to ``scratch``."""
    runs = []
    for folders in recipe.runs:
        found = sorted(RESULTS.glob(folders))
        if not found:
            raise PosGPTError(f"{REGISTRY.name}: {recipe.report}: no run folder matches {folders!r} under results/")
        runs += [str(run) for run in found]
    outputs = []
    study = RESULTS / recipe.report.split("/")[0]
    for option, name in recipe.outputs.items():  # the rest lie beside the markdown, in the scratch folder
        suffix = ".csv" if option == "--task-csv" else ".png"
        # an output the report does not commit (None) goes to the scratch folder in either case
        committed = write_plots and name is not None
        target = study / name if committed else scratch / f"{option.strip('-')}{suffix}"
        outputs += [option, str(target)]
    return [*runs, *recipe.options, "--markdown", str(markdown), *outputs]


def rebuild_report(recipe: Recipe, scratch: Path, write_plots: bool = False) -> str:
    """The markdown compare.py writes for ``recipe`` now: without ``write_plots``, its plan's text, nothing drawn
    or written (compare.py writes that text as planned); with it, compare.py run (its printed copy silenced), the
    committed plots written to their files and the others to ``scratch``."""
    markdown = scratch / "report.md"
    argv = compare_argv(recipe, markdown, scratch, write_plots)
    with contextlib.redirect_stdout(io.StringIO()):
        if not write_plots:
            return compare.plan_comparison(compare.parse_args(argv)).report
        compare.main(argv)
    return markdown.read_text()


@dataclass
class Table:
    """One markdown table of a report: its lines as written, then its cells split."""

    text: str
    header: list[str]
    align: list[str]
    rows: list[list[str]]


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip()[1:-1].split("|")]


def tables_in(text: str) -> list[Table]:
    """The tables of a markdown text in order: runs of lines starting with ``|``."""
    tables, block = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            block.append(line)
        elif block:
            tables.append(Table("\n".join(block), cells(block[0]), cells(block[1]), [cells(row) for row in block[2:]]))
            block = []
    return tables


def section_of(text: str, heading: str | None, where: str) -> str:
    """The report's ``## `` section whose heading starts with ``heading`` (the whole text without one)."""
    if heading is None:
        return text
    parts = re.split(r"^## ", text, flags=re.M)
    found = [part for part in parts[1:] if part.startswith(heading)]
    if len(found) != 1:
        headings = "; ".join(part.splitlines()[0] for part in parts[1:]) or "none"
        raise PosGPTError(f"{where}: {len(found)} sections start with {heading!r} (the report's: {headings})")
    return found[0]


@dataclass
class Spec:
    """A parsed table marker: its source report and its keys, each value split at `` | ``."""

    source: str
    keys: dict[str, list[str]]
    where: str

    def one(self, key: str) -> str | None:
        return " | ".join(self.keys[key]) if key in self.keys else None


def parse_spec(spec: str, where: str) -> Spec:
    """Read a marker's text: the report's path, then ``key: value`` lines (a line not starting with a key
    continues the value before it)."""
    lines = [line.strip() for line in spec.strip().splitlines() if line.strip()]
    source, values, key = lines[0], {}, None
    for line in lines[1:]:
        match = re.match(r"([\w-]+): ?(.*)$", line)
        if match and match.group(1) in KEYS:
            key, line = match.group(1), match.group(2)
            values[key] = ""
        elif key is None:
            raise PosGPTError(f"{where}: {line!r} in a table marker is not a key; the keys: {', '.join(KEYS)}")
        values[key] = f"{values[key]} {line}".strip()
    if source != MODULES and not (ROOT / source).is_file():
        raise PosGPTError(f"{where}: the table marker names {source}, which is not a file of the repository")
    return Spec(source, {k: [item.strip() for item in v.split(" | ")] for k, v in values.items()}, where)


def table_number(text: str, spec: Spec) -> int:
    """A marker's table number (``table: 2``, ``@2``): a whole number from 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise PosGPTError(f"{spec.where}: table {text.strip()!r}: a table is named by its number, from 1")
    return int(text)


def report_text(report: str, spec: Spec) -> str:
    path = ROOT / report
    if not path.is_file():
        raise PosGPTError(f"{spec.where}: the table marker names {report}, which is not a file of the repository")
    return path.read_text()


def pick_table(report: str, spec: Spec, index: int) -> Table:
    """The ``index``-th table (from 1) of the marker's section of a report."""
    tables = tables_in(section_of(report_text(report, spec), spec.one("section"), spec.where))
    if index > len(tables):
        raise PosGPTError(f"{spec.where}: table {index} asked of {report}, whose section has {len(tables)}")
    return tables[index - 1]


def renamed(item: str, sep: str) -> tuple[str, str]:
    """``"shown = source"`` -> (shown, source); an item without ``sep`` names itself: (item, item)."""
    shown, found, source = item.partition(sep)
    return shown.strip(), (source.strip() if found else shown.strip())


def lookup(items: list[str], wanted: str, what: str, spec: Spec, report: str, table: int) -> int:
    if wanted not in items:
        raise PosGPTError(f"{spec.where}: no {what} {wanted!r} in table {table} of {report}")
    return items.index(wanted)


def typeset(cell: str, column: str, other_report: bool, spec: Spec) -> str:
    """The cell as the block prints it: bold dropped where ``bold``, ``plain`` or ``main-bold`` say, the minus
    sign set, a cell without a value (``-``) written as ``dash`` says."""
    plain = column in spec.keys.get("plain", []) or (other_report and column in spec.keys.get("main-bold", []))
    if plain or spec.one("bold") == "none":
        cell = cell.replace("**", "")
    if cell == "-" and "dash" in spec.keys:
        return spec.one("dash")
    minus = spec.one("minus")
    return re.sub(r"-(?=\d)", minus, cell) if minus else cell


def selection(spec: Spec) -> str:
    """A table built from the marker's ``columns`` and ``rows`` (each defaulting to all of the marker's table):
    each cell looked up by its row's label and its column's heading in the table they name."""
    index = table_number(spec.one("table") or "1", spec)
    base = pick_table(spec.source, spec, index)
    columns = []  # (heading shown, source heading, table number)
    for item in spec.keys.get("columns", base.header):
        named, found, number = item.partition(" @")
        columns.append((*renamed(named, " = "), table_number(number, spec) if found else index))
    lines, align = [], [base.align[0]] * len(columns)
    for item in spec.keys.get("rows", [row[0] for row in base.rows]):
        named, _, report = item.partition(" @ ")
        shown, label = renamed(named, " = ")
        report = report.strip() or spec.source
        line = []
        for i, (heading, column, number) in enumerate(columns):
            if column == base.header[0]:  # the label column
                line.append(shown)
                continue
            table = pick_table(report, spec, number)
            col = lookup(table.header, column, "column", spec, report, number)
            row = table.rows[lookup([row[0] for row in table.rows], label, "row", spec, report, number)]
            line.append(typeset(row[col], heading, report != spec.source, spec))
            align[i] = table.align[col]
        lines.append("| " + " | ".join(line) + " |")
    header = "| " + " | ".join(heading for heading, _, _ in columns) + " |"
    return "\n".join([header, "|" + "|".join(align) + "|", *lines])


def block_text(spec: Spec) -> str:
    """What the marker's block holds: a whole report, one of its tables verbatim, a selection, or the map of the
    modules."""
    if spec.source == MODULES:
        return module_map()
    if "columns" in spec.keys or "rows" in spec.keys:
        return selection(spec)
    if "table" in spec.keys or "section" in spec.keys:
        return pick_table(spec.source, spec, table_number(spec.one("table") or "1", spec)).text
    return report_text(spec.source, spec).rstrip("\n")


def first_sentence(docstring: str) -> str:
    """A docstring's first sentence (to the first full stop that ends a word, not e.g., i.e. or et al.), on one line,
    ``|`` escaped for a table cell."""
    paragraph = " ".join(docstring.split("\n\n", 1)[0].split())
    match = re.search(r"(?<!e\.g)(?<!i\.e)(?<! al)(?<=[\w)`'\"])\.(\s|$)", paragraph)
    return (paragraph[: match.start() + 1] if match else paragraph).replace("|", "\\|")


def module_map(root: Path = ROOT) -> str:
    """A table of every module of PACKAGES (their subpackages too), by path, and its docstring's first sentence."""
    lines = ["| module | what it holds |", "|---|---|"]
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
                lines.append(f"| `{path.relative_to(root).as_posix()}` | {first_sentence(docstring)} |")
    return "\n".join(lines)


def shown_path(path: Path) -> str:
    """``path`` relative to the repository where it lies in it."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def rebuilt_doc(path: Path) -> tuple[str, list[str]]:
    """The page with every marked block rewritten from its report, and ``path:line`` of each block that changed."""
    text, stale = read_user_text(path, "a page of marked tables"), []
    if len(OPENING.findall(text)) != len(MARKER.findall(text)):
        raise PosGPTError(f"{shown_path(path)}: a '<!-- table:' marker has no '<!-- /table -->' after it")

    def rewrite(match: re.Match) -> str:
        where = f"{shown_path(path)}:{text.count(chr(10), 0, match.start()) + 1}"
        body = block_text(parse_spec(match.group("spec"), where)) + "\n\n"  # a blank line ends a table before the close
        if body != match.group("body"):
            stale.append(where)
        return match.group(0)[: match.start("body") - match.start()] + body + "<!-- /table -->"

    return MARKER.sub(rewrite, text), stale


def rebuild_reports(recipes: list[Recipe], check: bool) -> list[str]:
    """Rebuild each report (and, unless ``check``, write it and its committed plots); the reports that differed."""
    stale = []
    with tempfile.TemporaryDirectory(prefix="rebuild-reports-") as scratch:
        for recipe in tqdm(recipes, desc="reports", unit="report"):
            text = rebuild_report(recipe, Path(scratch), write_plots=not check)
            committed = RESULTS / recipe.report
            if not committed.is_file() or read_user_text(committed, "a committed report") != text:
                stale.append(f"results/{recipe.report}")
                if not check:
                    atomic_write(committed, text)
    return stale


def rebuild_docs(pages: list[Path], check: bool) -> list[str]:
    """Rewrite (unless ``check``) the marked blocks of ``pages``; the blocks that differed."""
    stale = []
    for path in pages:
        if not path.is_file():
            raise PosGPTError(f"{path}: no such page")
        text, changed = rebuilt_doc(path)
        stale += changed
        if changed and not check:
            atomic_write(path, text)
    return stale


def check_registry(recipes: list[Recipe]) -> None:
    """Refuse a registry that leaves out a committed report, or lists one twice."""
    committed = {str(path.relative_to(RESULTS)) for path in RESULTS.glob("*/comparison*.md")}
    listed = [recipe.report for recipe in recipes]
    missing = sorted(committed - set(listed))
    if missing or len(listed) != len(set(listed)):
        raise PosGPTError(
            f"{REGISTRY.relative_to(ROOT)}: add a recipe for {', '.join(missing) or 'none'}; list each once"
        )


@exit_on_user_error
def main(argv: list[str]) -> None:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each stale report or table")
    parser.add_argument("--docs-only", action="store_true", help="only the quoted tables, from the committed reports")
    parser.add_argument(
        "pages", nargs="*", type=Path, help=f"the pages whose marked tables to rebuild (default: {', '.join(DOCS)})"
    )
    args = parser.parse_args(argv)
    recipes = load_registry()
    check_registry(recipes)
    stale = [] if args.docs_only else rebuild_reports(recipes, args.check)
    stale += rebuild_docs(args.pages or [ROOT / name for name in DOCS], args.check)
    verb = "stale" if args.check else "rewritten"
    for where in stale:
        print(f"{verb}: {where}")
    print(f"rebuild_reports: {len(stale)} {verb} ({'tables only' if args.docs_only else f'{len(recipes)} reports'})")
    if stale and args.check:
        sys.exit(1)


if __name__ == "__main__":
    unwind_on_sigterm()  # SIGTERM unwinds: an atomic write in progress leaves no temporary file
    main(sys.argv[1:])
