"""Fuzz every command line with values and files drawn from the schema: each answer must be a result or one line.

    python tests/support/fuzz_cli.py                             # the long profile: 2,000 cases (some 35 minutes)
    python tests/support/fuzz_cli.py --examples 300 --seed 3     # another seed, another count
    python tests/support/fuzz_cli.py --profile ci                # what the suite runs (tests/commands/test_fuzz_cli.py)
    python tests/support/fuzz_cli.py --subprocess                # each case as a real `python <command> ...` (slower)

Developer tooling, not a command: it lives beside the test that runs its short profile
(tests/commands/test_fuzz_cli.py), which imports it as ``fuzz_cli``.

A property-based test on Hypothesis. Commands: train.py, eval.py, sample.py, scripts/inspect_attention.py,
scripts/compare.py and scripts/export_results.py. The values come from the schema itself (experiment/config.py
and every scheme's dataclass in model/pe/, with the domains of core/domain.py), so a key added later is fuzzed
too: per key, the boundary values inside its domain (the smallest value it takes, the smallest positive float
where 0 is excluded, 1, the largest sensible value; lists of one element) and values drawn between them, and
values outside it (just past each bound, nan/inf, huge numbers, the wrong type, null, bad lists, a very long
string, unicode, an unresolvable interpolation); per path-like key, a missing path, a directory, a file that is
not UTF-8, an empty file, garbage. Every command gets damaged run directories (garbage, truncated, non-UTF-8
results; a checkpoint that lost a weight or whose config no longer fits it; an empty directory; a file), and
compare.py and export_results.py outputs that name their inputs.

Each case must end in one of (docs/reliability.md):

- exit 0 and the command's own result (a checkpoint, results, samples, a table, an export);
- exit 2 (a mistake in the command) or 74 (a fault of the machine) and a last stderr line ``error: ...``;

never a traceback, and nothing it did not write on success changed: every file of the runs and files it was
pointed at is hashed before and after (eval.py and inspect_attention.py may add to their run's eval/ when they
succeed). A failing case is shrunk by Hypothesis to a minimal one (the simplest key and value that still fail),
printed as the falsifying example: it reproduces by hand, and becomes a named test in tests/commands/test_fuzz_cli.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run by hand (python tests/support/fuzz_cli.py) only tests/ is on sys.path: the repository root and scripts/
# (compare.py, and _repo.py, which the commands it runs import) go there, as tests/conftest.py puts them under pytest.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import math
import os
import random
import runpy
import shutil
import subprocess
import sysconfig
import tempfile
import types
import typing
import warnings
from collections import Counter
from collections.abc import Callable, Iterator

from compare import DEFAULT_MARKDOWN, default_outputs
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from omegaconf import OmegaConf

from core.config_keys import may_change
from core.domain import Interval, domain_of
from experiment.config import schema
from experiment.settings import eval_settings
from model.pe import SCHEMES

REPO = Path(__file__).resolve().parents[2]

TRAIN = "train.py"
EVAL = "eval.py"
SAMPLE = "sample.py"
INSPECT = "scripts/inspect_attention.py"
COMPARE = "scripts/compare.py"
EXPORT = "scripts/export_results.py"
COMMANDS = (TRAIN, EVAL, SAMPLE, INSPECT, COMPARE, EXPORT)
READS_RUN = (EVAL, SAMPLE, INSPECT)  # run_dir=<run> plus overrides
OK, USER_ERROR, MACHINE_FAULT = 0, 2, 74

# The workspace's scheme: any would do; a learned table adds the refusals past its size to what is fuzzed.
WORKSPACE_PE = "learned"
# A tiny model on a small corpus: a case whose value is in fact legal trains one step in well under a second.
TINY = [
    f"pe={WORKSPACE_PE}",
    "data=text",
    "model.n_layer=1",
    "model.n_embd=16",
    "model.n_head=2",
    "train.seq_len=16",
    "train.batch_size=4",
    "train.num_threads=1",
    "train.val_batches=1",
    "train.max_steps=1",
    "train.eval_after=false",
    "eval.length_multipliers=[1,2]",
    "eval.max_tokens=256",
    "logging.wandb.mode=disabled",
    "logging.progress=false",
]
# A task run's: TINY less its data and what only a language-model run reads (a task run refuses it)
TASK_TINY = [arg for arg in TINY[2:] if not arg.startswith("eval.max_tokens=")]
# Keys whose size is the amount of work, with the largest value a case may take inside their domain (a huge legal
# value would run for ever, so they get no huge values); every other key's largest sensible value is LARGEST.
WORK_KEYS = {
    "train.max_steps": 4,
    "train.batch_size": 8,
    "train.grad_accum_steps": 4,
    "train.val_batches": 4,
    "train.seq_len": 64,
    "train.random_positions": 256,
    "train.num_threads": 2,
    "eval.max_tokens": 512,
    "eval.batch_tokens": 4096,
    "eval.lengths": 128,
    "eval.length_multipliers": 8,
    "sample.max_new_tokens": 8,
    "sample.num_samples": 4,
    "inspect.windows": 4,
    "inspect.length_multipliers": 8,
    "data.num_proc": 2,
    "data.max_documents": 1000,
    "model.n_layer": 2,
    "model.n_embd": 64,
    "model.n_head": 8,
    "model.vocab_size": 100_000,
}
LARGEST = 2**31 - 1
# Keys whose legal values would reach the network or another device (this fuzzer stays on the CPU, offline).
SKIPPED_KEYS = {"data.source", "data.hub_path", "data.hub_name", "train.device", "logging.wandb.mode"}
PATH_KEYS = {"data.files", "train.init_from", "sample.prompt_file", "data.cache_dir", "eval.key_evaluator"}


# --- the schema's keys --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Key:
    """A leaf of the schema: its dotted name, element type (int, float, str, bool), whether it is a list or may be
    None, and its declared numeric domain."""

    key: str
    kind: type
    is_list: bool
    optional: bool
    interval: Interval | None


def _element(hint: typing.Any) -> tuple[typing.Any, bool, bool]:
    """(element type, is a list, may be None) of a field's type hint."""
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        optional = type(None) in args
        (hint,) = [arg for arg in args if arg is not type(None)]
    if typing.get_origin(hint) is list:
        return typing.get_args(hint)[0], True, optional
    return hint, False, optional


def schema_keys(config: typing.Any, prefix: str = "") -> Iterator[Key]:
    """Every leaf key of a config dataclass instance (nested ones included), e.g. of
    ``OmegaConf.to_object(schema(pe))``."""
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            yield from schema_keys(value, f"{prefix}{field.name}.")
            continue
        kind, is_list, optional = _element(hints[field.name])
        if kind in (int, float, str, bool):
            yield Key(prefix + field.name, kind, is_list, optional, domain_of(field))


def all_keys() -> list[Key]:
    """The keys of every scheme's schema, each once (pe.* of every scheme)."""
    found: dict[str, Key] = {}
    for pe in SCHEMES:
        for key in schema_keys(OmegaConf.to_object(schema(pe))):
            found.setdefault(key.key, key)
    return list(found.values())


def scheme_of(key: str) -> str | None:
    """A scheme that has the pe.* key ``key`` (None for a key outside pe.)."""
    if not key.startswith("pe."):
        return None
    for pe in SCHEMES:
        if any(k.key == key for k in schema_keys(OmegaConf.to_object(schema(pe)))):
            return pe
    return None


# --- values inside and outside each key's domain ---------------------------------------------------------

HUGE = 2**70
LONG = "x" * 5000
# Any key: what Hydra's grammar cannot parse, the wrong type, null, odd strings, an unresolvable interpolation.
ANY_VALUES = ["abc", "[1,2", "{", "null", "''", LONG, "'ü∞☃'", "${oc.env:POSGPT_FUZZ_UNSET}", "${no.such.key}"]
NUMBER_VALUES = ["nan", "inf", "-inf", "-1", "0", "1e400", "-0.0", "true", "[1]"]
LIST_VALUES = ["[]", "[abc]", "[nan]", "[-1]", "[0]", "[[1]]", "[1,null]", "7"]


def outside(interval: Interval, kind: type) -> list[str]:
    """A value just past each bound of a domain."""
    bounds = [
        None if interval.ge is None else interval.ge - 1,
        interval.gt,
        None if interval.le is None else interval.le + 1,
        interval.lt,
    ]
    return [str(kind(bound)) for bound in bounds if bound is not None]


def limits(key: Key) -> tuple[float, float]:
    """The smallest and the largest sensible value of a numeric key's domain (both inside it): just past an open
    bound (the next integer, or the next float: 5e-324 past 0), and at most WORK_KEYS' or LARGEST (1e30 for a float)
    where the domain has no upper bound."""
    interval = key.interval or Interval()
    step = (lambda x: x + 1) if key.kind is int else (lambda x: math.nextafter(x, math.inf))
    back = (lambda x: x - 1) if key.kind is int else (lambda x: math.nextafter(x, -math.inf))
    largest = WORK_KEYS.get(key.key, LARGEST if key.kind is int else 1e30)
    low = interval.ge if interval.ge is not None else (step(interval.gt) if interval.gt is not None else -largest)
    high = interval.le if interval.le is not None else (back(interval.lt) if interval.lt is not None else largest)
    if key.key in WORK_KEYS or (interval.le is None and interval.lt is None):
        high = min(high, max(largest, low))
    return key.kind(low), key.kind(high)


def boundaries(key: Key) -> list[str]:
    """The values at the edges of a numeric key's domain, inside it: its smallest value (5e-324, the smallest
    positive float, where the domain excludes 0), 1, the smallest normal float, its largest sensible value."""
    low, high = limits(key)
    found = [low, high, *(value for value in (1, sys.float_info.min) if low <= value <= high)]
    if key.kind is int:
        found = [int(value) for value in found if float(value).is_integer()]
    values = list(dict.fromkeys(repr(key.kind(value)) for value in found))
    return [f"[{value}]" for value in values] if key.is_list else values


def inside(key: Key) -> st.SearchStrategy[str]:
    """Values a key may take: its boundaries first (what a shrink ends on), then any value of its domain."""
    if key.kind is bool:
        return st.sampled_from(["true", "false"])
    if key.kind is str:
        return st.just("null") if key.optional else st.nothing()
    low, high = limits(key)
    numbers = st.integers(low, high) if key.kind is int else st.floats(low, high, allow_nan=False)
    drawn = st.lists(numbers, min_size=1, max_size=3) if key.is_list else numbers
    return st.sampled_from(boundaries(key)) | drawn.map(lambda value: str(value).replace(" ", ""))


def outside_values(key: Key, files: dict[str, Path]) -> list[str]:
    """The values outside a key's domain or type it is fuzzed with (as typed on the command line)."""
    values = list(ANY_VALUES)
    if key.kind in (int, float):
        values += LIST_VALUES if key.is_list else NUMBER_VALUES
        if key.key not in WORK_KEYS:
            values += [f"[{HUGE}]", f"[{-HUGE}]"] if key.is_list else [str(HUGE), str(-HUGE)]
        if key.interval is not None:
            values += [f"[{v}]" if key.is_list else v for v in outside(key.interval, key.kind)]
    elif key.is_list:
        values += ["[]", "[null]", "[[a]]", "[1,abc]", "[{a:1}]"]
    elif key.kind is bool:
        values += ["2", "yes please", "[true]"]
    if key.key in PATH_KEYS:
        paths = [str(path) for path in files.values()]
        values += [f"[{path}]" for path in paths] if key.is_list else paths
    return values


def values(key: Key, files: dict[str, Path]) -> st.SearchStrategy[str]:
    """Every value a key is fuzzed with: inside its domain, then outside it."""
    return inside(key) | st.sampled_from(outside_values(key, files))


# --- the files a case is pointed at -------------------------------------------------------------------------


def make_bad_files(folder: Path) -> dict[str, Path]:
    """Files a user might hand in by mistake, by name (some are missing or cannot exist: a path is what is fuzzed)."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "missing": folder / "missing.txt",
        "directory": folder / "a-directory",
        "not_utf8": folder / "latin1.txt",
        "empty": folder / "empty.txt",
        "garbage_pt": folder / "garbage.pt",
        "garbage_json": folder / "garbage.json",
        "too_long": folder / ("x" * 300),  # longer than a file name may be (255 bytes)
    }
    files["directory"].mkdir(exist_ok=True)
    files["not_utf8"].write_bytes(b"caf\xe9 au lait\n" * 50)
    files["empty"].write_bytes(b"")
    files["garbage_pt"].write_bytes(random.Random(300).randbytes(300))  # fixed bytes: the same cases on every run
    files["garbage_json"].write_text('{"pe": "x", "results": [')  # truncated JSON
    return files


def damaged_runs(good: Path, folder: Path) -> dict[str, Path]:
    """Copies of a trained, evaluated run, each damaged in one way compare.py or export_results.py reads."""
    folder.mkdir(parents=True, exist_ok=True)
    results = good / "eval" / "extrapolation.json"
    text = results.read_text()

    def copy(name: str, damage: Callable[[Path], object]) -> Path:
        run = folder / name
        shutil.copytree(good, run, ignore=shutil.ignore_patterns("checkpoints", ".posgpt.lock"))
        damage(run)
        return run

    runs = {
        "garbage_results": copy("garbage-results", lambda r: (r / "eval/extrapolation.json").write_text("{not json")),
        "truncated_results": copy(
            "truncated-results", lambda r: (r / "eval/extrapolation.json").write_text(text[: len(text) // 2])
        ),
        "latin1_results": copy(
            "latin1-results", lambda r: (r / "eval/extrapolation.json").write_bytes(text.encode()[:40] + b"\xe9\xff")
        ),
        "list_results": copy("list-results", lambda r: (r / "eval/extrapolation.json").write_text("[1, 2]")),
        "rows_damaged": copy("rows-damaged", lambda r: _damage_rows(r / "eval/extrapolation.json")),
        "garbage_attention": copy("garbage-attention", lambda r: (r / "eval/attention.json").write_text("[oops")),
        "garbage_metrics": copy("garbage-metrics", lambda r: (r / "metrics.jsonl").write_bytes(b"\xff\xfe{]\n[1]\n")),
        "no_eval": copy("no-eval", lambda r: shutil.rmtree(r / "eval")),
    }
    runs["empty_dir"] = folder / "empty-dir"
    runs["empty_dir"].mkdir(exist_ok=True)
    runs["a_file"] = folder / "a-file"
    runs["a_file"].write_text("not a run\n")
    runs["missing"] = folder / "missing-run"
    for damage in ("weight_missing", "config_misfit", "weight_nan"):  # checkpoints that contradict themselves
        runs[f"checkpoint_{damage}"] = folder / f"checkpoint-{damage.replace('_', '-')}"
        shutil.copytree(good, runs[f"checkpoint_{damage}"], ignore=shutil.ignore_patterns(".posgpt.lock"))
        _damage_checkpoint(runs[f"checkpoint_{damage}"] / "checkpoints" / "last.pt", damage)
    return runs


def _damage_checkpoint(path: Path, damage: str) -> None:
    """A checkpoint that lost its last weight, holds a NaN, or whose config no longer describes its weights (twice
    the width)."""
    import torch

    state = torch.load(path, weights_only=True)
    if damage == "weight_missing":
        del state["model"][list(state["model"])[-1]]
    elif damage == "weight_nan":
        state["model"][list(state["model"])[0]].view(-1)[0] = float("nan")
    else:
        state["config"]["model"]["n_embd"] *= 2
    path.unlink()  # not through a hard link: the run's step_*.pt stays whole
    torch.save(state, path)


def _damage_rows(path: Path) -> None:
    """Results whose rows have the right keys but values of the wrong kind."""
    document = json.loads(path.read_text())
    for row in document["results"]:
        row.update({"ppl": "high", "loss": None, "tokens": -1, "protocol": 7, "variation": ["x"]})
    path.write_text(json.dumps(document))


# --- cases --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    command: str
    args: tuple[str, ...]  # what the case adds to the command's base arguments
    what: str  # a short description for the report

    def __str__(self) -> str:
        return f"{self.command} {self.what}"


@dataclasses.dataclass
class Workspace:
    """What the cases run on: a trained, evaluated and inspected tiny run, bad files and damaged runs (the
    inputs, hashed around every case), and a scratch folder where cases write what they may."""

    root: Path
    corpus: Path = dataclasses.field(init=False)
    run: Path = dataclasses.field(init=False)
    files: dict[str, Path] = dataclasses.field(init=False)
    runs: dict[str, Path] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.inputs = self.root / "inputs"
        self.scratch = self.root / "scratch"
        self.corpus = self.inputs / "corpus.txt"
        self.run = self.inputs / "run"
        self.task_run = self.inputs / "task-run"  # a run whose tokens are a task's symbols, not GPT-2's
        self.cache = self.root / "cache"

    def prepare(self, run: Callable[[str, list[str], Path], Outcome]) -> None:
        """Make the inputs with the commands themselves (each must succeed)."""
        self.inputs.mkdir(parents=True, exist_ok=True)
        self.scratch.mkdir(parents=True, exist_ok=True)
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        self.corpus.write_text((stdlib / "argparse.py").read_text()[:40_000])
        for command, argv in (
            (TRAIN, [*self.train_base(self.run), "train.max_steps=2", "train.eval_after=true"]),
            (INSPECT, [f"run_dir={self.run}", "inspect.length_multipliers=[1]", "inspect.windows=1"]),
            (TRAIN, [*TASK_TINY, "task=passkey", f"hydra.run.dir={self.task_run}", "train.max_steps=2"]),
        ):
            outcome = run(command, argv, self.scratch)
            if outcome.code != OK:
                raise RuntimeError(f"preparing the fuzz workspace: {command} failed:\n{outcome.stderr}")
        self.files = make_bad_files(self.inputs / "bad")
        self.files["run_dir"] = self.run
        self.files["checkpoint"] = self.run / "checkpoints" / "last.pt"
        self.runs = {**damaged_runs(self.run, self.inputs / "runs"), "task_run": self.task_run}

    def train_base(self, run_dir: Path) -> list[str]:
        return [*TINY, f"data.files=[{self.corpus}]", f"hydra.run.dir={run_dir}"]

    def base(self, command: str, case: Case, scratch: Path) -> list[str]:
        """The command's arguments without the case's own: the keys the case sets are left out here."""
        if command == TRAIN:
            named = {arg.split("=", 1)[0].lstrip("+~") for arg in case.args}
            base = [arg for arg in self.train_base(scratch / "new-run") if arg.split("=", 1)[0] not in named]
            return base
        if command in READS_RUN:
            has_run = any(arg.startswith("run_dir=") for arg in case.args)
            small = ["sample.max_new_tokens=4"] if command == SAMPLE else []
            return small + ([] if has_run else [f"run_dir={self.run}"])
        if command == COMPARE:
            return [] if any(not arg.startswith("--") for arg in case.args) else [str(self.run)]
        if command == EXPORT:
            base = [] if any(not arg.startswith("--") for arg in case.args[:1]) else [str(self.run)]
            return base + ([] if "--to" in case.args else ["--to", str(scratch / "export")])
        raise ValueError(command)

    def file_cases(self) -> list[Case]:
        """Bad run directories and bad outputs for every command; bad options for compare.py."""
        found = []
        targets = {**{f"run {name}": path for name, path in self.runs.items()}, **self.files}
        for name, path in targets.items():
            for command in READS_RUN:
                found.append(Case(command, (f"run_dir={path}",), f"run_dir= {name}"))
            found.append(Case(TRAIN, (f"hydra.run.dir={path}",), f"hydra.run.dir= {name}"))
            found.append(Case(TRAIN, (f"hydra.run.dir={path}", "train.resume=true"), f"resume in {name}"))
            found.append(Case(COMPARE, (str(path),), f"run {name}"))
            found.append(Case(COMPARE, (str(self.run), str(path)), f"good run + {name}"))
            found.append(Case(EXPORT, (str(path),), f"run {name}"))
            found.append(Case(EXPORT, (str(self.run), "--to", str(path)), f"--to {name}"))
        outputs = {
            "its results": self.run / "eval" / "extrapolation.json",
            "its checkpoint": self.run / "checkpoints" / "last.pt",
            "its metrics": self.run / "metrics.jsonl",
            "the run": self.run,
            "a directory": self.files["directory"],
            "a missing folder": self.files["missing"] / "deeper" / "out.md",
            "the corpus": self.corpus,
        }
        for name, path in outputs.items():
            for option in ("--markdown", "--plot", "--per-position", "--val-curve", "--entropy"):
                found.append(Case(COMPARE, (str(self.run), option, str(path)), f"{option} {name}"))
            found.append(Case(EXPORT, (str(self.run), "--to", str(path)), f"--to {name}"))
        for option in ("--stride", "--data", "--baseline", "--protocol"):
            for value in ("abc", "-1", "0", str(HUGE), "", LONG, "ü∞"):
                args = (str(self.run), "--protocol", "sliding", option, value)
                found.append(Case(COMPARE, args, f"{option} {value[:20]!r}"))
        found += [
            Case(COMPARE, (str(self.run), str(self.run)), "the same run twice"),
            Case(COMPARE, (str(self.run), "--nope"), "an unknown option"),
            Case(COMPARE, (str(self.run), "--ratios", "--per-position", "pp.png"), "--ratios --per-position"),
            Case(EXPORT, (str(self.run), str(self.run)), "the same run twice"),
            Case(EXPORT, (str(self.run),), "no --to"),
        ]
        return found


# --- the cases, as a Hypothesis strategy ----------------------------------------------------------------------


def config_case(ws: Workspace, command: str, key: Key) -> st.SearchStrategy[Case]:
    """``command`` with ``key`` set to a value drawn from :func:`values` (a pe.* key with a scheme that has it)."""
    scheme = scheme_of(key.key) if command == TRAIN else None

    def case(value: str) -> Case:
        override = f"{key.key}={value}"
        shown = override if len(override) < 80 else override[:60] + f"...({len(override)} chars)"
        return Case(command, (*([f"pe={scheme}"] if scheme else []), override), shown)

    return values(key, ws.files).map(case)


def keys_of(command: str) -> list[Key]:
    """The keys a command takes: every key for train.py, those an evaluation may change for the others."""
    keys = [key for key in all_keys() if key.key not in SKIPPED_KEYS]
    if command == TRAIN:
        return keys
    allowed = eval_settings(WORKSPACE_PE)
    return [k for k in keys if may_change(k.key, allowed) and (command == SAMPLE or not k.key.startswith("sample."))]


def cases(ws: Workspace) -> st.SearchStrategy[Case]:
    """A command, then one of its cases: a key's value (train.py and the commands that read a run), or a bad file,
    run directory, output or option."""
    files = ws.file_cases()

    def of(command: str) -> st.SearchStrategy[Case]:
        own = st.sampled_from([case for case in files if case.command == command])
        keys = keys_of(command) if command == TRAIN or command in READS_RUN else []
        if not keys:
            return own
        return st.sampled_from(keys).flatmap(lambda key: config_case(ws, command, key)) | own

    return st.sampled_from(COMMANDS).flatmap(of)


# --- running and checking a case ------------------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    code: int | str  # the exit code, or "exception" for an exception that escaped the in-process run
    stdout: str
    stderr: str


def run_in_process(command: str, argv: list[str], cwd: Path) -> Outcome:
    """``python <command> <argv>`` in this process (runpy, as __main__, with the real argv): a subprocess per case
    would cost seconds of importing torch each."""
    import torch

    out, err = io.StringIO(), io.StringIO()
    saved_argv, saved_cwd, grad = sys.argv, Path.cwd(), torch.is_grad_enabled()
    code: int | str = OK
    sys.argv = [str(REPO / command), *argv]
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            # as in a process of its own: every warning printed to stderr (not collected by pytest, nor shown
            # once per process), where check() sees a library's line beside the error line
            warnings.simplefilter("always")
            warnings.showwarning = _print_warning
            try:
                runpy.run_path(str(REPO / command), run_name="__main__")
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else (OK if exit_.code is None else 1)
            except BaseException as error:  # noqa: BLE001 (what escapes is what a user would see as a traceback)
                code = "exception"
                err.write(f"Traceback (escaped the command): {type(error).__name__}: {error}\n")
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        torch.set_grad_enabled(grad)
    return Outcome(code, out.getvalue(), err.getvalue())


def _print_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: object = None,
    line: str | None = None,
) -> None:
    """warnings.showwarning as Python's own, to the stderr of the moment (the case's, redirected)."""
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def run_subprocess(command: str, argv: list[str], cwd: Path, timeout: float = 600) -> Outcome:
    done = subprocess.run(
        [sys.executable, str(REPO / command), *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    return Outcome(done.returncode, done.stdout, done.stderr)


def snapshot(folder: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under ``folder`` (a directory: "dir")."""
    found = {}
    for path in sorted(folder.rglob("*")):
        name = str(path.relative_to(folder))
        found[name] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def succeeded(command: str, case: Case, outcome: Outcome, scratch: Path, workspace: Workspace) -> bool:
    """The command's own result is there."""
    if command == TRAIN:
        run_dirs = [arg.split("=", 1)[1] for arg in case.args if arg.startswith("hydra.run.dir=")]
        run_dir = Path(run_dirs[0]) if run_dirs else scratch / "new-run"
        return (run_dir / "checkpoints" / "last.pt").is_file()
    if command == EVAL:
        return "ppl" in outcome.stdout or "eval:" in outcome.stdout
    if command == SAMPLE:
        return "sample 1" in outcome.stdout
    if command == INSPECT:
        return "inspect: wrote" in outcome.stdout
    if command == COMPARE:
        return "|" in outcome.stdout or any(scratch.glob("*.md")) or "--markdown" in case.args
    if command == EXPORT:
        return "export:" in outcome.stdout
    raise ValueError(command)


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))


OUTPUT_OPTIONS = (
    "--markdown",
    "--plot",
    "--per-position",
    "--val-curve",
    "--entropy",
    "--task-plot",
    "--task-csv",
    "--to",
)


def may_write(case: Case, name: str, inputs: Path) -> bool:
    """Whether ``case``'s command, when it succeeds, may write the input file ``name`` (relative to ``inputs``): a
    run's eval/ (eval.py, inspect_attention.py), the run directory a training makes, the outputs and the token
    cache folder (data.cache_dir) named."""
    if case.command == TRAIN:
        return True
    if case.command in (EVAL, INSPECT) and ("eval" in Path(name).parts or "wandb" in Path(name).parts):
        return True
    path = inputs / name
    named = [Path(value) for option, value in zip(case.args, case.args[1:]) if option in OUTPUT_OPTIONS]
    named += [Path(arg.split("=", 1)[1]) for arg in case.args if arg.startswith("data.cache_dir=")]  # token caches
    if case.command == COMPARE:  # compare.py's default plots and CSV lie beside its markdown
        named += default_outputs(Path(dict(zip(case.args, case.args[1:])).get("--markdown", DEFAULT_MARKDOWN))).values()
    # the output, what lies in an output folder, or a folder made to hold an output
    return any(path == output or output in path.parents or path in output.parents for output in named)


def check(command: str, case: Case, outcome: Outcome, changed: list[str], scratch: Path, ws: Workspace) -> str | None:
    """What is wrong with how a case ended, or None."""
    output = outcome.stdout + outcome.stderr
    if "Traceback" in output:
        lines = [line for line in outcome.stderr.splitlines() if line.strip()]
        return f"traceback: {lines[-1] if lines else ''}"[:300]
    if outcome.code not in (OK, USER_ERROR, MACHINE_FAULT):
        return f"exit code {outcome.code}: {outcome.stderr.strip()[-300:]}"
    if outcome.code == OK:
        if not succeeded(command, case, outcome, scratch, ws):
            return f"exit 0 without its result: {output.strip()[-300:]}"
        wrong = [name for name in changed if not may_write(case, name, ws.inputs)]
        if wrong:
            return f"exit 0 but changed inputs it does not write: {wrong[:5]}"
        return None
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    if not lines or not lines[-1].startswith("error: "):
        return f"exit {outcome.code} without a last line 'error: ...': {outcome.stderr.strip()[-300:]!r}"
    beside = [line for line in lines if not line.startswith(("error: ", "warning: "))]
    if beside:  # a library's warning or message printed beside posgpt's one line
        return f"exit {outcome.code} with other lines beside 'error: ...': {beside[0][:200]!r}"
    if changed:
        return f"refused (exit {outcome.code}) but changed {changed[:5]}"
    return None


Runner = Callable[[str, list[str], Path], Outcome]


def run_case(ws: Workspace, case: Case, runner: Runner) -> tuple[Outcome, str | None]:
    """Run ``case`` in a scratch folder of its own, hashing the inputs around it: how it ended, and what is wrong
    with that (None: nothing)."""
    scratch = Path(tempfile.mkdtemp(prefix="case-", dir=ws.scratch))
    before = snapshot(ws.inputs)
    outcome = runner(case.command, [*ws.base(case.command, case, scratch), *case.args], scratch)
    problem = check(case.command, case, outcome, changes(before, snapshot(ws.inputs)), scratch, ws)
    if outcome.code == OK and problem is None:
        shutil.rmtree(scratch, ignore_errors=True)
    return outcome, problem


# The suite's profile draws the same cases on every run (no example database, derandomized) and few enough of them
# to take about twenty seconds; the long one is for a hunt by hand. Neither has a deadline: a legal value trains.
_COMMON = {
    "database": None,
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
PROFILES = {
    "ci": settings(derandomize=True, max_examples=20, print_blob=False, **_COMMON),
    "long": settings(max_examples=2000, **_COMMON),
}


def hunt(
    ws: Workspace,
    profile: settings,
    runner: Runner = run_in_process,
    seed: int | None = None,
) -> Counter:
    """The property over :func:`cases` under ``profile``: each case ends in its result or one line. Returns how the
    cases ended, (command, "exit N") -> count; a failure raises, with the case Hypothesis shrank it to."""
    tally: Counter = Counter()

    @profile
    @given(cases(ws))
    def every_case_ends_in_a_result_or_one_line(case: Case) -> None:
        outcome, problem = run_case(ws, case, runner)
        tally[case.command, f"exit {outcome.code}"] += 1
        assert problem is None, f"{case}: {problem}"

    if seed is not None:
        every_case_ends_in_a_result_or_one_line = hypothesis_seed(seed)(every_case_ends_in_a_result_or_one_line)
    every_case_ends_in_a_result_or_one_line()
    return tally


def fuzz(root: Path, profile: settings, seed: int | None = None, subprocesses: bool = False) -> Counter:
    """Prepare a workspace under ``root`` and :func:`hunt` over it."""
    saved = dict(os.environ)
    os.environ.update(POSGPT_CACHE_DIR=str(root / "cache"), WANDB_SILENT="true")  # the subprocesses' too
    try:
        ws = Workspace(root)
        ws.prepare(run_in_process)
        return hunt(ws, profile, run_subprocess if subprocesses else run_in_process, seed)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def report(tally: Counter) -> str:
    """Per command, how many cases ended how."""
    endings = sorted({ending for _, ending in tally})
    lines = [" | ".join(["command", *endings]), " | ".join("---" for _ in range(len(endings) + 1))]
    for command in COMMANDS:
        lines.append(" | ".join([command, *(str(tally[command, ending]) for ending in endings)]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="long")
    parser.add_argument("--examples", type=int, default=None, help="run this many cases (default: the profile's)")
    parser.add_argument("--seed", type=int, default=None, help="Hypothesis's seed (default: a random one)")
    parser.add_argument("--subprocess", action="store_true", help="run each case as a real command line")
    parser.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it (default: a temp one)")
    args = parser.parse_args(argv)
    profile = PROFILES[args.profile]
    if args.examples is not None:
        profile = settings(profile, max_examples=args.examples)
    with contextlib.ExitStack() as stack:
        root = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="posgpt-fuzz-")))
        tally = fuzz(root.absolute(), profile, args.seed, args.subprocess)
    print(report(tally))


if __name__ == "__main__":
    main()
