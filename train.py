"""Train a GPT with the positional scheme of your choice, then measure how it extrapolates.

    python train.py                                   # 2 layers, width 256, embedded corpus, RoPE, CPU-friendly
    python train.py model=tiny                        # width 64: about 2.5x faster on a CPU
    python train.py pe=alibi train.max_steps=3000     # another scheme, longer
    python train.py -m pe=sinusoidal,learned,rope,alibi,none   # several schemes, identical settings
    python train.py hydra.run.dir=outputs/run1 train.resume=true      # continue a stopped run
    torchrun --standalone --nproc_per_node=2 train.py # DDP (train.distributed=fsdp for FSDP2)
    python train.py -m hydra/launcher=slurm pe=rope,alibi hydra.launcher.partition=gpu   # one SLURM job each
    python train.py --check -m pe=rope,alibi train.seed=1,2,3   # plan every job, train none, write nothing

Everything lands in the Hydra run directory (hydra.run.dir=...): see docs/configuration.md. SIGTERM or Ctrl-C save a
checkpoint and exit with 128 + the signal's number. Any mistake in the command (a misspelt key, a wrong type,
an unknown option) is one line, ``error: ...``, exit code 2, and leaves the run directory as it was (a new one
made for it is removed again). One command at a time writes a run directory (core/rundir.py).

The command plans the run (experiment/plan.py: every check runs there), then trains as planned (training/loop.py);
a sweep plans every job before the first one trains. ``--check`` (first) stops after the plans: exit 0 when every
job would start, else the refusal's one line.
"""

import core.interrupts  # noqa: F401 (first: Ctrl-C while the libraries below import is one line)

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from core.cli import exit_on_user_error
from core.errors import PosGPTError
from core.rundir import removed_if_unused
from core.tracking import check_wandb
from experiment.compose import (
    check_group_choices,
    compose_config,
    hydra_errors_as_user_errors,
    planned_run_dirs,
    sweep_jobs,
)
from experiment.config import register_configs
from experiment.plan import plan_each, plan_training
from training.loop import train

register_configs()


@hydra.main(version_base=None, config_path="configs", config_name="config")
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    # Hydra's errors in the job itself (an interpolation that does not resolve) are ours to print: escaping the
    # job, Hydra would print its own line before ours.
    with removed_if_unused(run_dir), hydra_errors_as_user_errors():  # Hydra made run_dir before train.py's checks
        plan = plan_training(cfg, list(hydra_cfg.overrides.task), run_dir)
        check_wandb(plan.tracker, run_dir)  # W&B's mode, login and folder, before the run writes
        stopped_by = train(plan, run_dir)
    if stopped_by is not None:
        # The exit status of a process killed by that signal: `train.py && eval.py` and sweeps stop here too.
        sys.exit(128 + stopped_by)


def check_sweep(argv: list[str]) -> None:
    """A multirun plans every job before the first one trains: one invalid value stops the whole sweep before any
    work, naming its job (each job plans itself again when it starts)."""
    jobs = sweep_jobs(argv)
    if jobs:  # a single run plans itself, in main()
        plan_each(jobs, compose_config, planned_run_dirs(argv, len(jobs)))


def check_only(argv: list[str]) -> None:
    """``--check``: plan the run, or every job of a sweep, as training would, and write nothing."""
    jobs = sweep_jobs([*argv, "-m"])  # a single run is a sweep of one job
    if not jobs:
        raise PosGPTError("train.py --check plans runs composed from configs/config.yaml: drop --config-name")
    plan_each(jobs, compose_config, planned_run_dirs(argv, len(jobs)))


@exit_on_user_error
def cli() -> None:
    checking = sys.argv[1:2] == ["--check"]
    argv = sys.argv[2:] if checking else sys.argv[1:]
    with hydra_errors_as_user_errors():
        check_group_choices(argv)
        if checking:
            return check_only(argv)
        check_sweep(argv)
        main()


if __name__ == "__main__":
    cli()
