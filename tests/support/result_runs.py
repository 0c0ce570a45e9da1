"""Result rows of tiny evaluations and hand-made runs (tests/evaluation/test_results.py,
tests/evaluation/test_extrapolation_overflow.py,
tests/evaluation/test_run.py): a corpus's splits, an evaluation config, an evaluation, a fake run."""

import sysconfig
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from data import DataConfig, load_splits
from evaluation.run import evaluate_run
from experiment.build import build_model
from experiment.config import Config, EvalConfig, LoggingConfig, TrainConfig, WandbConfig
from experiment.plan import evaluation_plan, plan_evaluators
from model import ModelConfig
from model.pe.rope import RoPEConfig
from reports.runs import Run

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def corpus_splits(tmp_path_factory, *modules: str) -> dict:
    """The train and val splits of a corpus made of some standard-library modules, named "tiny" whatever
    they hold (the case that used to mix corpora up)."""
    folder = tmp_path_factory.mktemp("corpus")
    (folder / "corpus.txt").write_text("\n".join((STDLIB / name).read_text() for name in modules))
    data = DataConfig(
        name="tiny",
        source="text",
        files=[str(folder / "corpus.txt")],
        val_fraction=0.5,
        num_proc=1,
        cache_dir=str(folder),
    )
    return load_splits(data)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return corpus_splits(tmp_path_factory, "textwrap.py", "string.py", "bisect.py")


def eval_config(pe=None, **eval_keys):
    """A tiny model's config (RoPE by default, trained at length 8), evaluated at 8 and 16 on 64 targets."""
    return OmegaConf.structured(
        Config(
            model=ModelConfig(n_layer=1, n_head=2, n_embd=32),
            pe=pe or RoPEConfig(),
            data=DataConfig(name="tiny"),
            train=TrainConfig(seq_len=8, max_steps=5),
            eval=EvalConfig(
                **{"length_multipliers": [1, 2], "protocols": ["nonoverlapping"], "max_tokens": 64, **eval_keys}
            ),
            logging=LoggingConfig(progress=False, wandb=WandbConfig(mode="disabled")),
        )
    )


def evaluate(tokens, run_dir, cfg=None, prepare=lambda model: None, context=None, **eval_keys):
    """evaluate_run of a freshly initialised model (``prepare`` may alter it first); ``context``: what else its
    context is given (a step, a W&B run)."""
    cfg = cfg or eval_config(**eval_keys)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    prepare(model)
    trained = OmegaConf.to_container(cfg, resolve=True)
    planned = evaluation_plan(cfg).context(
        model, run_dir, torch.device("cpu"), torch.float32, trained, **(context or {})
    )
    return evaluate_run(planned, tokens, plan_evaluators(cfg))


# compare.py on hand-made runs


def fake_run(pe, seed, ppl, digest="a" * 64, backend="sdpa", dtype="float32", split="val", targets=(64, 128)):
    row = {
        "length": 16,
        "protocol": "nonoverlapping",
        "stride": None,
        "scaling": None,
        "data": "d",
        "corpus": "files d.txt",
        "split": split,
        "split_digest": digest,
        "attn_backend": backend,
        "dtype": dtype,
        "ppl": ppl,
        "tokens": 64,
        "target_range": list(targets),
    }
    config = {"pe": {"name": pe}, "train": {"seed": seed, "seq_len": 16}}
    return Run(Path(f"/runs/{pe}-{seed}"), {"pe": pe, "train_seq_len": 16, "step": 10, "results": [row]}, config)
