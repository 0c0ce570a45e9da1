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
from core.rundir import removed_if_unused
from experiment.compose import hydra_errors_as_user_errors
from experiment.config import register_configs
from training.loop import train

register_configs()


@hydra.main(version_base=None, config_path="configs", config_name="config")
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    with removed_if_unused(run_dir):  # Hydra made it before train.py could check the command
        stopped_by = train(cfg, run_dir, list(hydra_cfg.overrides.task))
    if stopped_by is not None:
        # The exit status of a process killed by that signal: `train.py && eval.py` and sweeps stop here too.
        sys.exit(128 + stopped_by)


@exit_on_user_error
def cli() -> None:
    with hydra_errors_as_user_errors():
        main()


if __name__ == "__main__":
    cli()
