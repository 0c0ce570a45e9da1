"""House rules a newcomer relies on: the code's defaults are the shipped ones, scripts run from anywhere, and no
code outside model/pe/ knows a positional scheme by name."""

import ast
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf
from repo_root import REPO

from experiment.compose import compose_config
from experiment.config import Config
from model.pe import SCHEMES

CONFIG = REPO / "configs"
POSGPT_PACKAGES = {"core", "data", "model", "experiment", "evaluation", "training", "reports"}


def differences(composed: dict, reference: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested dicts."""
    found = []
    for key in sorted(composed.keys() | reference.keys()):
        ours, theirs = composed.get(key), reference.get(key)
        if isinstance(ours, dict) and isinstance(theirs, dict):
            found += differences(ours, theirs, f"{prefix}{key}.")
        elif ours != theirs:
            found.append(f"{prefix}{key}: shipped {ours!r}, dataclass {theirs!r}")
    return found


def test_dataclass_defaults_are_the_shipped_defaults():
    """`python train.py` (configs/config.yaml and its default groups) and the dataclasses agree on every key:
    ModelConfig() is the shipped default model, DataConfig() the default corpus, and so on."""
    shipped = OmegaConf.to_container(compose_config([]), resolve=True)
    reference = OmegaConf.to_container(OmegaConf.structured(Config))
    shipped.pop("pe"), reference.pop("pe")  # each scheme's own, below
    assert differences(shipped, reference) == []


def repeated_defaults(own: dict, reference: dict, prefix: str = "") -> list[str]:
    """Dotted keys that a yaml sets to the value its dataclass already defaults to."""
    found = []
    for key, value in own.items():
        theirs = reference.get(key, object()) if isinstance(reference, dict) else object()
        if isinstance(value, dict) and isinstance(theirs, dict):
            found += repeated_defaults(value, theirs, f"{prefix}{key}.")
        elif value == theirs:
            found.append(f"{prefix}{key}: {value!r}")
    return found


def group_dataclasses() -> dict[str, Callable[[str], type]]:
    """Each config group whose options are set over a dataclass: the dataclass of an option, by its name."""
    from data.config import DataConfig
    from data.tasks import task_config_class
    from model.gpt import ModelConfig

    return {
        "pe": lambda name: SCHEMES[name].config_class,
        "task": task_config_class,
        "model": lambda name: ModelConfig,
        "data": lambda name: DataConfig,
    }


def shipped_options() -> list[tuple[str, str]]:
    """(group, option) for every yaml of every group set over a dataclass, and every registered scheme."""
    found = {(path.parent.name, path.stem) for group in group_dataclasses() for path in (CONFIG / group).glob("*.yaml")}
    return sorted(found | {("pe", name) for name in SCHEMES})


@pytest.mark.parametrize(("group", "name"), shipped_options(), ids=lambda value: value)
def test_a_yaml_sets_only_what_differs_from_its_dataclass(group, name):
    """configs/<group>/<name>.yaml holds a comment saying what it is, its defaults list and only the keys whose value
    differs from the dataclass's default: the dataclass is the one copy of every default (and of what each setting
    means, in its field's comment). A task's file is global: only its task.* are over the task's dataclass, its
    model.* and train.* set what its runs learn with whatever model preset comes before."""
    path = CONFIG / group / f"{name}.yaml"
    assert path.is_file(), f"{group}={name} is registered but has no {path.relative_to(REPO)}"
    text = path.read_text()
    assert text.startswith("#"), f"{path.relative_to(REPO)} starts with a comment saying what it is"
    own = yaml.safe_load(text) or {}
    if group == "pe":
        assert own.pop("defaults") == [f"/schema/pe/{name}@_here_", "_self_"]
        assert "model/pe/" in text.split("defaults:")[0], "the header names the scheme's module"
    if group == "task":
        own.pop("defaults")
        own = own.get("task", {})
    reference = OmegaConf.to_container(OmegaConf.structured(group_dataclasses()[group](name)))
    assert repeated_defaults(own, reference) == [], f"{path.relative_to(REPO)} repeats its dataclass's defaults"


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_each_scheme_composes_to_its_dataclass_and_its_yaml(name):
    """pe=<name> is the dataclass's defaults, changed where the yaml says: no key of the yaml is lost or unknown."""
    shipped = OmegaConf.to_container(compose_config([f"pe={name}"]).pe, resolve=True)
    own = yaml.safe_load((CONFIG / "pe" / f"{name}.yaml").read_text())
    own.pop("defaults")
    reference = OmegaConf.merge(OmegaConf.structured(SCHEMES[name].config_class), own)
    assert differences(shipped, OmegaConf.to_container(reference)) == []


@pytest.mark.parametrize("path", sorted((REPO / "scripts").glob("*.py")), ids=lambda path: path.name)
def test_scripts_put_the_repository_on_the_path_before_importing_it(path):
    """`python scripts/<name>.py` has only scripts/ on sys.path: `import _repo` must come before posgpt's imports
    (ruff --fix once removed it as unused)."""
    imports = [node for node in ast.parse(path.read_text()).body if isinstance(node, (ast.Import, ast.ImportFrom))]
    names = [alias.name if isinstance(node, ast.Import) else node.module for node in imports for alias in node.names]
    posgpt = [i for i, name in enumerate(names) if name and name.split(".")[0] in POSGPT_PACKAGES]
    if path.name == "_repo.py":  # it puts the path itself, then imports core.interrupts for every script
        assert "sys.path.insert" in path.read_text().split("import core.interrupts")[0]
    elif posgpt:
        assert "_repo" in names[: posgpt[0]], f"{path.name} imports posgpt without `import _repo` first"


def python_sources() -> list[Path]:
    """Every posgpt source file but the tests (none under a hidden folder either: a .venv or .offline_bundle is
    not ours)."""
    sources = []
    for path in sorted(REPO.rglob("*.py")):
        top = path.relative_to(REPO).parts[0]
        if top not in ("tests", "docs") and not top.startswith("."):
            sources.append(path)
    return sources


def test_no_module_state_drives_a_forward_pass():
    """Per-forward settings (attention capture, the scheme's positions) travel as arguments: no `global` in the
    model or anything that runs it (evaluation, training). core/'s process-level state (the run-directory lock's
    note of what existed before Hydra made the run directory) is not per-forward state."""
    offenders = [
        f"{path.relative_to(REPO)}:{', '.join(node.names)}"
        for path in python_sources()
        if path.relative_to(REPO).parts[0] != "core"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Global)
    ]
    # A kernel failing at first use (FlexAttention, a scheme's own) is recorded by the model's Fallback for it
    # (model/fallback.py), not in module state.
    assert sorted(offenders) == []


def test_the_scheme_is_registered_once_and_handed_to_every_layer():
    from model import GPT
    from model.gpt import ModelConfig

    model = GPT(ModelConfig(n_embd=32, n_layer=3), SCHEMES["t5"].config_class(), train_seq_len=16)
    assert [key for key in model.state_dict() if key.endswith(".table")] == ["pe.table"]  # T5's, not once per layer
    probs: list = []
    model(torch.randint(0, 100, (1, 8)), capture=probs)
    assert len(probs) == 3  # one per layer, through the argument


# Scheme names and settings that are also ordinary words or API names elsewhere ("log scale", matplotlib's base=2,
# reduction="none", a file's path): checked only where a string spells them as a setting (pe.base, pe=none, pe=path).
PLAIN_WORDS = {"none", "base", "scale", "p", "path", "window"}
# Deliberate mentions: (file, name, why).
ALLOWED = {
    ("scripts/speed_nanogpt.py", "learned"),  # nanoGPT's own model (learned positions), not a posgpt scheme
}


def scheme_vocabulary() -> tuple[set[str], set[str]]:
    """(names code outside model/pe/ must not use, setting names strings must not spell as pe.<name>): the
    registered schemes, their modules, and the fields of their config dataclasses, less the generic interface."""
    import dataclasses
    import pkgutil

    import model.pe
    from model.pe import PEConfig, PositionalEncoding

    modules = {info.name for info in pkgutil.iter_modules(model.pe.__path__)} - {"base", "capabilities"}
    settings = {field.name for scheme in SCHEMES.values() for field in dataclasses.fields(scheme.config_class)}
    settings -= {field.name for field in dataclasses.fields(PEConfig)} | set(dir(PositionalEncoding))
    return (set(SCHEMES) | modules | settings) - PLAIN_WORDS, set(SCHEMES) | settings


def docstring_nodes(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def scheme_mentions(source: str, forbidden: set[str], spelled: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each identifier, import or string (not a docstring, not a comment) naming a scheme or a
    scheme's setting."""
    import re

    tree = ast.parse(source)
    docstrings = docstring_nodes(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            words = set(re.findall(r"[A-Za-z_]\w*", node.value)) & forbidden
            words |= {m for m in re.findall(r"\bpe[=.](\w+)", node.value) if m in spelled}
        else:
            names = {
                ast.Name: lambda n: [n.id],
                ast.Attribute: lambda n: [n.attr],
                ast.keyword: lambda n: [n.arg],
                ast.arg: lambda n: [n.arg],
                ast.FunctionDef: lambda n: [n.name],
                ast.ClassDef: lambda n: [n.name],
                ast.alias: lambda n: n.name.split("."),
                ast.ImportFrom: lambda n: (n.module or "").split("."),
            }.get(type(node), lambda n: [])(node)
            words = set(names) & forbidden
        found += [(getattr(node, "lineno", 0), word) for word in sorted(words)]
    return found


def test_no_code_outside_model_pe_names_a_scheme_or_its_settings():
    """Every scheme lives in model/pe/: other code reaches it through the interface (model/pe/base.py) and the
    registry, never by name, so a scheme is added or changed in one place."""
    forbidden, spelled = scheme_vocabulary()
    offenders = []
    for path in python_sources():
        relative = path.relative_to(REPO).as_posix()
        if relative.startswith("model/pe/"):
            continue
        offenders += [
            f"{relative}:{line}: {word}"
            for line, word in scheme_mentions(path.read_text(), forbidden, spelled)
            if (relative, word) not in ALLOWED
        ]
    assert offenders == []


def test_the_scheme_rule_sees_names_settings_and_imports_but_not_docstrings():
    forbidden, spelled = scheme_vocabulary()
    source = '''"""Docstrings may explain pe=alibi and pe.scaling."""
from model.pe.rope_scaling import scaling_label
# comments too: rope
def f(cfg):
    """And here: rope."""
    if cfg.pe.name == "alibi":
        return cfg.pe.scaling
    return plot(base=2, label="log scale", reduction="none", hint="set pe.base=500")
'''
    assert scheme_mentions(source, forbidden, spelled) == [
        (2, "rope_scaling"),
        (6, "alibi"),
        (7, "scaling"),
        (8, "base"),
    ]


MAX_FUNCTION_LINES = 60


def project_sources() -> list[Path]:
    """posgpt's own code: its packages, the top-level commands and scripts/ (not tests/, not results/)."""
    packages = [path for name in sorted(POSGPT_PACKAGES) for path in sorted((REPO / name).rglob("*.py"))]
    return packages + sorted(REPO.glob("*.py")) + sorted((REPO / "scripts").glob("*.py"))


def long_functions(source: str) -> list[str]:
    """``name:line (n lines)`` of each function or method over MAX_FUNCTION_LINES lines, counted from its `def` to
    its last line: its decorators are not counted."""
    return [
        f"{node.name}:{node.lineno} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def test_no_function_is_over_60_lines():
    """A function a reader takes in at once: one over 60 lines is split into named steps."""
    offenders = [
        f"{path.relative_to(REPO)}:{found}" for path in project_sources() for found in long_functions(path.read_text())
    ]
    assert offenders == []


def test_the_length_rule_catches_a_61_line_function_and_walks_the_project(tmp_path):
    def function(name: str, lines: int, indent: str = "") -> str:
        body = "".join(f"{indent}    x = {i}\n" for i in range(lines - 2))
        return f"{indent}@decorator\n{indent}def {name}():\n{body}{indent}    return x\n"

    source = tmp_path / "lengths.py"
    source.write_text(
        function("sixty", 60) + function("sixty_one", 61) + "class C:\n" + function("method", 61, indent="    ")
    )
    assert long_functions(source.read_text()) == ["sixty_one:63 (61 lines)", "method:126 (61 lines)"]
    walked = {path.relative_to(REPO).as_posix() for path in project_sources()}
    assert {"training/loop.py", "model/pe/base.py", "train.py", "scripts/compare.py"} <= walked
    assert not any(name.startswith(("tests/", "results/", ".")) for name in walked)


def legacy_document(pe: str, setting: dict | None) -> dict:
    """An extrapolation.json as posgpt wrote it before rows had a variation: each setting a field of its own."""
    row = {"length": 16, "protocol": "nonoverlapping", "stride": None, "scaling": setting, "data": "d", "ppl": 9.0}
    return {"pe": pe, "train_seq_len": 8, "step": 5, "results": [row]}


@pytest.mark.parametrize(
    ("pe", "setting", "label"),
    [
        ("alibi", None, ""),
        ("rope", {"type": "none", "factor": 1.0, "beta_fast": 32.0, "beta_slow": 1.0}, ""),
        ("rope", {"type": "yarn", "factor": 16.0, "beta_fast": 32.0, "beta_slow": 1.0}, "yarn:16"),
    ],
)
def test_results_written_before_variations_read_as_todays(tmp_path, pe, setting, label):
    import json

    from evaluation.perplexity_format import PERPLEXITY_ROWS, load_results
    from evaluation.render import csv_rows
    from evaluation.results import setting_label
    from evaluation.store import merge_documents

    (tmp_path / "extrapolation.json").write_text(json.dumps(legacy_document(pe, setting)))
    old = load_results(tmp_path)
    row = old["results"][0]
    assert "scaling" not in row and row["variation"] == label
    assert row["variation_settings"] == ({} if setting is None else {"scaling": setting})
    assert list(row)[:5] == ["length", "protocol", "stride", "variation", "variation_settings"]  # where it was
    assert csv_rows(old, PERPLEXITY_ROWS)[0]["variation"] == label
    assert setting_label(row) == f"nonoverlapping {label}".strip()
    # today's evaluation of the same measurement replaces it
    new = {**old, "results": [{**row, "ppl": 8.0}]}
    merged, replaced = merge_documents(old, new, PERPLEXITY_ROWS)
    assert [r["ppl"] for r in merged["results"]] == [8.0] and replaced.startswith("replaced 1 earlier row")


def test_checkpoint_configs_with_eval_scalings_read_as_eval_variations():
    from experiment.settings import trained_config

    saved = OmegaConf.to_container(OmegaConf.structured(Config(pe=SCHEMES["rope"].config_class())))
    del saved["eval"]["variations"]
    saved["eval"]["scalings"] = ["yarn:16"]  # its name until 2026-11-24
    assert list(trained_config(saved).eval.variations) == ["yarn:16"]


def test_load_parent_returns_the_childs_config_and_leaves_the_given_one(tmp_path):
    from tiny_checkpoint import make_run

    from experiment.plan import load_parent

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("def f():\n    return 1\n" * 50)
    parent_dir = make_run(tmp_path / "parent", corpus, "pe=rope", "train.seq_len=16")
    cfg = compose_config(
        [
            "pe=rope",
            "data=text",
            f"data.files=[{corpus}]",
            "model.n_layer=1",
            "model.n_embd=16",
            "model.n_head=2",
            "train.seq_len=32",
            "pe.scaling.type=yarn",
            "pe.scaling.factor=2",
            f"train.init_from={tmp_path}/elsewhere/../parent",
        ]
    )
    before = OmegaConf.to_container(cfg)
    child, parent = load_parent(cfg)
    assert OmegaConf.to_container(cfg) == before  # not mutated
    assert parent.seq_len == 16 and child.pe.scaling.original_seq_len == 16  # RoPE's inherit: the parent's L
    assert child.train.init_from == str(parent_dir.resolve())  # made absolute


# Sources of numbers that differ from run to run: a test drawing from them is a CI gate that fails by chance.
UNSEEDED = ("os.urandom", "uuid.uuid", "secrets.", "random.SystemRandom", "time.time_ns()", "datetime.now()")


@pytest.mark.parametrize(
    "path", sorted((REPO / "tests").rglob("*.py")), ids=lambda path: str(path.relative_to(REPO / "tests"))
)
def test_no_test_draws_numbers_that_differ_between_runs(path):
    """Random inputs come from a fixed seed (conftest.py seeds the global generators before every test, Hypothesis
    runs derandomized in the suite), so a test that fails once fails on every run."""
    source = path.read_text()
    if path.name == "test_house_rules.py":
        source = source.split("UNSEEDED = ")[0]
    assert [name for name in UNSEEDED if name in source] == []


def test_every_test_starts_from_the_same_random_state():
    """conftest.py's seeding: what a test draws without a generator does not depend on the tests before it."""
    assert torch.equal(torch.rand(3), torch.rand(3, generator=torch.Generator().manual_seed(0)))


def test_a_test_may_leave_gradients_off_as_a_scripts_main_does():
    torch.set_grad_enabled(False)  # eval.py's, sample.py's and the scripts' main() do, and tests call them


def test_the_next_test_starts_with_gradients_on():
    """conftest.py: a test starts as a fresh process would, whatever the test before it left (runs after the test
    above, in the same worker: pytest runs a file's tests in order)."""
    assert torch.is_grad_enabled()


@pytest.fixture(scope="module")
def cache_seen_by_a_module_fixture() -> str | None:
    """What a module fixture that trains (the passkey run of test_task_lengths.py) sees as the token cache."""
    return os.environ.get("POSGPT_CACHE_DIR")


def test_fixtures_of_every_scope_tokenize_into_the_sessions_cache(cache_seen_by_a_module_fixture, tmp_path_factory):
    """conftest.py: a fixture that ran before the first test's own setup once tokenized into ~/.cache/posgpt, and
    the next test on the same corpus tokenized again, printing a progress bar beside its one-line refusal."""
    session_cache = str(tmp_path_factory.getbasetemp() / "posgpt-cache")
    assert cache_seen_by_a_module_fixture == session_cache == os.environ["POSGPT_CACHE_DIR"]
