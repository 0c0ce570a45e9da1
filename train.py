"""Train a GPT with the positional scheme of your choice, then measure how it extrapolates.

    python train.py                                   # 2 layers, width 256, embedded corpus, RoPE, CPU-friendly
    python train.py model=tiny                        # width 64: about 2.5x faster on a CPU
    python train.py pe=alibi train.max_steps=3000     # another scheme, longer
    python train.py -m pe=sinusoidal,learned,rope,alibi,none   # several schemes, identical settings
    python train.py hydra.run.dir=outputs/run1 train.resume=true      # continue a stopped run
    torchrun --standalone --nproc_per_node=2 train.py # DDP (train.distributed=fsdp for FSDP2)
    python train.py -m hydra/launcher=slurm pe=rope,alibi hydra.launcher.partition=gpu   # one SLURM job each

Everything lands in the Hydra run directory (hydra.run.dir=...): see docs/configuration.md. SIGTERM or Ctrl-C save a
checkpoint and exit with 128 + the signal's number. Any mistake in the command (a misspelt key, a wrong type,
an unknown option) is one line, ``error: ...``, exit code 2, and leaves the run directory as it was (a new one
made for it is removed again). One command at a time writes a run directory (core/rundir.py).
"""

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from core.cli import exit_on_user_error
from core.errors import PosGPTError
from core.rundir import removed_if_unused
from experiment.compose import check_group_choices, compose_config, hydra_errors_as_user_errors, sweep_jobs
from experiment.config import register_configs
from experiment.settings import check_command_settings
from training.loop import check_before_training, train

register_configs()


@hydra.main(version_base=None, config_path="configs", config_name="config")
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    # Hydra's errors in the job itself (an interpolation that does not resolve) are ours to print: escaping the
    # job, Hydra would print its own line before ours.
    with removed_if_unused(run_dir), hydra_errors_as_user_errors():  # Hydra made run_dir before train.py's checks
        stopped_by = train(cfg, run_dir, list(hydra_cfg.overrides.task))
    if stopped_by is not None:
        # The exit status of a process killed by that signal: `train.py && eval.py` and sweeps stop here too.
        sys.exit(128 + stopped_by)


def check_sweep(argv: list[str]) -> None:
    """A multirun checks every job's config before the first one trains: one invalid value stops the whole sweep
    before any work, naming its job (each job checks itself again when it starts)."""
    jobs = sweep_jobs(argv)
    for number, job in enumerate(jobs):
        try:
            check_before_training(compose_config(job))
            check_command_settings(job, "train.py")
        except PosGPTError as error:
            swept = [override for override in job if any(override not in other for other in jobs)]
            raise type(error)(f"job {number} of the sweep ({' '.join(swept)}): {error}") from None


@exit_on_user_error
def cli() -> None:
    with hydra_errors_as_user_errors():
        check_group_choices(sys.argv[1:])
        check_sweep(sys.argv[1:])
        main()


if __name__ == "__main__":
    cli()
