"""Every command, fed values and files drawn from the schema, ends with a result or one line
(tests/support/fuzz_cli.py).

The fuzzer is a property-based test on Hypothesis: its strategies and checker live in tests/support/fuzz_cli.py
(``python tests/support/fuzz_cli.py`` hunts with the long profile); here its deterministic profile (no example database,
derandomized, a bounded number of cases) runs in this process on every test run, and each failure it found,
shrunk to a minimal case, is pinned by a named test below.
"""

from __future__ import annotations

import fuzz_cli
import pytest
from cli_runs import assert_one_line_error

from core.cli import ArgumentParser, exit_on_user_error
from core.errors import PosGPTError
from core.files import check_outputs
from data.config import DataConfig, validate_data_config
from evaluation.plots import check_image_paths
from experiment.compose import compose_config
from experiment.config import validate


def key(name: str) -> fuzz_cli.Key:
    return next(k for k in fuzz_cli.all_keys() if k.key == name)


def test_the_generator_covers_every_command_and_key():
    keys = {key.key for key in fuzz_cli.all_keys()}
    assert {"train.beta1", "eval.variations", "data.files", "pe.scaling.factor", "sample.prompt_file"} <= keys
    assert fuzz_cli.PATH_KEYS <= keys and set(fuzz_cli.WORK_KEYS) <= keys and fuzz_cli.SKIPPED_KEYS <= keys
    assert {k.key for k in fuzz_cli.keys_of(fuzz_cli.SAMPLE)} >= {"sample.temperature", "eval.max_tokens"}
    assert not any(k.key.startswith("model.n_") for k in fuzz_cli.keys_of(fuzz_cli.EVAL))  # not for a trained run


@pytest.mark.parametrize(
    "name, edges",
    [
        ("train.lr", ["5e-324", "1e+30", "1.0", "2.2250738585072014e-308"]),  # (0, inf): the smallest positive float
        ("sample.temperature", ["0.0", "1e+30", "1.0", "2.2250738585072014e-308"]),
        ("train.beta1", ["0.0", "0.9999999999999999", "2.2250738585072014e-308"]),  # [0, 1): no 1
        ("train.batch_size", ["1", "8"]),  # a batch of 1; work keys stop at a small largest value
        ("train.seq_len", ["1", "64"]),  # a length of 1
        ("train.seed", ["0", "4294967295", "1"]),
        ("eval.lengths", ["[1]", "[128]"]),  # lists of one element
        ("pe.rope.base", ["1.0000000000000002", "1e+30"]),  # (1, inf): the float just above 1
    ],
)
def test_the_boundaries_drawn_lie_inside_each_domain(name, edges):
    """Values at the edge of a domain, inside it, are drawn as well as values outside it (round 4 of the
    reliability issues: sample.temperature=1e-40 passed its check and crashed torch.multinomial)."""
    assert fuzz_cli.boundaries(key(name)) == edges
    interval = key(name).interval
    assert all(float(edge.strip("[]")) in interval for edge in edges)


@pytest.mark.slow  # trains a tiny model (in this process), and a case whose value is legal trains a step
def test_every_command_ends_in_a_result_or_one_line(tmp_path, monkeypatch):
    """The property under the suite's profile: the same cases on every run; a failure is shrunk and printed."""
    monkeypatch.chdir(tmp_path)
    tally = fuzz_cli.fuzz(tmp_path, fuzz_cli.PROFILES["ci"])
    print(f"\n{fuzz_cli.report(tally)}")
    assert {command for command, _ in tally} == set(fuzz_cli.COMMANDS)
    assert tally[fuzz_cli.TRAIN, "exit 0"] > 0  # values inside their domains were drawn, and trained


# --- the classes of failure the fuzzer found, one test each ---------------------------------------------------


def test_argparse_mistakes_are_one_line(capsys):
    @exit_on_user_error
    def main(argv):
        parser = ArgumentParser(prog="tool.py")
        parser.add_argument("--stride", type=int)
        parser.parse_args(argv)

    for argv in (["--stride", "abc"], ["--nope"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
        assert "see tool.py --help" in err


@pytest.mark.parametrize(
    "override",
    ["eval.lengths=[[1]]", "eval.length_multipliers=[[2]]", "eval.protocols=[[a]]", "data.files=[[a]]"],
)
def test_a_nested_list_in_a_list_setting_is_refused(override):
    """OmegaConf types a list's scalars but lets a nested list through; the domain check then raised TypeError."""
    key = override.split("=")[0]
    with pytest.raises(PosGPTError, match=rf"^{key}\[0\]=\[.*\] is not of type (int|float|str): {key} is a list of"):
        validate(compose_config(["pe=learned", override]))


def test_an_output_under_a_file_is_refused_before_anything_is_written(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    with pytest.raises(PosGPTError, match="lies under .*a-file, which is a file, not a folder"):
        check_outputs({"--to": a_file / "run" / "eval" / "extrapolation.json"})


@pytest.mark.parametrize("name", ["x" * 5000, "loop"])
def test_a_path_no_file_can_have_is_one_line(name, tmp_path, capsys):
    """A path too long for the file system, or a loop of symbolic links, wherever a command first touches it
    (sample.prompt_file=<5000 characters> raised OSError ENAMETOOLONG from Path.is_dir)."""
    (tmp_path / "loop").symlink_to(tmp_path / "loop")

    @exit_on_user_error
    def main():
        (tmp_path / name).is_dir()
        (tmp_path / name).read_bytes()

    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert len(err) < 300


def test_a_plot_path_that_names_no_image_format_is_refused():
    """compare.py --plot comparison.txt computed everything, then matplotlib's savefig raised ValueError."""
    check_image_paths({"--plot": "a.png", "--entropy": "b.PDF", "--val-curve": None})
    for path in ("comparison.txt", "comparison"):
        with pytest.raises(PosGPTError, match=rf"^--plot {path}: name an image file"):
            check_image_paths({"--plot": path})


@pytest.mark.parametrize("name", ["x" * 5000, "../elsewhere", "a/b", ".."], ids=["long", "up", "slash", "dotdot"])
def test_a_data_name_that_is_no_folder_name_is_refused(name):
    """data.name names the token cache's folder: 5000 characters ended as exit 74 (a fault of the machine) when
    the folder was made, and '../elsewhere' wrote the cache outside data.cache_dir."""
    with pytest.raises(PosGPTError, match=r"^data\.name=.* names the token cache's folder"):
        validate_data_config(DataConfig(name=name))


def test_a_cache_dir_that_is_a_file_is_a_mistake_in_the_command(tmp_path):
    """data.cache_dir=<a file> ended as exit 74 (a fault of the machine) when the token cache was written."""
    (tmp_path / "a-file").write_text("x")
    for cache_dir in (tmp_path / "a-file", tmp_path / "a-file" / "deeper"):
        with pytest.raises(PosGPTError, match=r"^data\.cache_dir .* is a file, not a folder"):
            validate_data_config(DataConfig(cache_dir=str(cache_dir)))


def test_a_run_directory_no_file_can_have_is_one_line_without_hydras_warning(tmp_path):
    """hydra.run.dir=<a name longer than the file system allows>: posgpt's run-directory callback raised OSError in
    Hydra, which printed it as a UserWarning above the error line (found by the fuzzer, shrunk to this case)."""
    too_long = tmp_path / ("x" * 300)
    outcome = fuzz_cli.run_in_process("train.py", ["pe=learned", f"hydra.run.dir={too_long}"], tmp_path)
    assert outcome.code == 2 and outcome.stderr.startswith("error: "), outcome.stderr
    assert len(outcome.stderr.strip().splitlines()) == 1, outcome.stderr


@pytest.mark.slow  # imports datasets (pyarrow, pandas)
def test_a_data_file_datasets_cannot_read_is_one_line_without_its_progress_bar(cli, tmp_path):
    """data.files=[<truncated JSON>]: datasets' "Generating train split: 0 examples" bar and its logged "Failed to
    load JSON ..." stood above the error line (found by the fuzzer through eval.py, shrunk to this case); the
    line now gives pyarrow's reason instead of datasets' "An error occurred while generating the dataset"."""
    garbage = tmp_path / "garbage.json"
    garbage.write_text('{"pe": "x", "results": [')
    done = cli.train_here(tmp_path / "run", f"data.files=[{garbage}]")
    assert_one_line_error(done, f"data.files: could not read {garbage} (JSON parse error: Invalid value. in row 0)")
