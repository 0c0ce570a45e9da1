"""configs/hydra/launcher/slurm.yaml: it composes, instantiates, and a sweep submits one SLURM job per scheme.

There is no SLURM here: the sweep test puts stand-ins for sbatch, srun and sacct on PATH, so submitit writes
and "submits" the real job script, which the test then reads.
"""

import os
import signal
import subprocess
import sys
import time

import pytest
import submitit
from cli_runs import REPO, TIMEOUT_S
from hydra import compose, initialize_config_dir
from hydra.core.utils import setup_globals
from hydra.utils import instantiate

from experiment.config import register_configs
from training.distributed import _export_submitit_ranks

SCHEMES = ["sinusoidal", "learned", "rope", "alibi", "none"]


def test_launcher_config_composes_and_instantiates():
    register_configs()
    setup_globals()  # Hydra's ${now:...} resolver, used by the sweep directory
    overrides = [
        "hydra/launcher=slurm",
        "hydra.launcher.partition=gpu",
        "hydra.launcher.gpus_per_node=4",
        "hydra.launcher.timeout_min=600",
    ]
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    launcher = instantiate(cfg.hydra.launcher)
    assert type(launcher).__name__ == "SlurmLauncher"  # Hydra loads its plugins under their own module names
    params = launcher.params
    assert (params["partition"], params["gpus_per_node"], params["timeout_min"]) == ("gpu", 4, 600)
    assert params["tasks_per_node"] == 4  # one task (= one DDP rank) per GPU
    assert params["max_num_timeout"] == 0 and params["signal_delay_s"] > 0


def fake_slurm(directory):
    """sbatch that keeps the job script and answers with a job id; srun and sacct that do nothing."""
    directory.mkdir()
    commands = {
        "sbatch": f'#!/bin/sh\ncp "$1" {directory}/job.sh\necho "Submitted batch job 4242"\n',
        "srun": "#!/bin/sh\nexit 1\n",
        "sacct": "#!/bin/sh\necho 'JobID|State|NodeList'\n",  # no news: the job looks pending forever
    }
    for name, text in commands.items():
        (directory / name).write_text(text)
        (directory / name).chmod(0o755)
    return directory


@pytest.mark.slow
def test_sweep_submits_one_job_per_scheme(cli, tmp_path):
    bin_dir, sweep_dir = fake_slurm(tmp_path / "bin"), tmp_path / "sweep"
    command = [
        sys.executable,
        "train.py",
        "-m",
        "hydra/launcher=slurm",
        f"pe={','.join(SCHEMES)}",
        "hydra.launcher.partition=gpu",
        "hydra.launcher.gpus_per_node=2",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    env = {**cli.env, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:  # after submitting, the launcher waits for the jobs to finish: they never will
        deadline = time.monotonic() + TIMEOUT_S
        while len(list(sweep_dir.glob(".submitit/4242_*/*_submitted.pkl"))) < len(SCHEMES):
            assert process.poll() is None, process.stdout.read()
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGKILL)
        process.communicate()

    script = (bin_dir / "job.sh").read_text()
    for line in [
        "--array=0-4",
        "--partition=gpu",
        "--gpus-per-node=2",
        "--ntasks-per-node=2",
        "--time=240",
        "--signal=USR2@120",
    ]:
        assert f"#SBATCH {line}" in script
    submissions = sorted(sweep_dir.glob(".submitit/4242_*/*_submitted.pkl"))
    job_overrides = [submitit.core.utils.pickle_load(path).args[0] for path in submissions]
    assert job_overrides == [[f"pe={scheme}"] for scheme in SCHEMES]


@pytest.fixture
def environ(monkeypatch):
    """A scratch os.environ, restored afterwards."""
    monkeypatch.setattr(os, "environ", {"PATH": os.environ["PATH"]})
    return os.environ


def test_tasks_of_a_slurm_job_become_ranks(environ):
    # Task 5 of a job with 8 tasks on gpu3 and gpu4, as srun would describe it.
    environ.update(
        SUBMITIT_EXECUTOR="slurm",
        SLURM_JOB_ID="77",
        SLURM_NTASKS="8",
        SLURM_JOB_NUM_NODES="2",
        SLURM_NODEID="1",
        SLURM_PROCID="5",
        SLURM_LOCALID="1",
        SLURM_JOB_NODELIST="gpu[3-4]",
    )
    _export_submitit_ranks()
    assert {key: environ[key] for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")} == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "gpu3",
    }
    assert "CUDA_VISIBLE_DEVICES" not in environ  # each rank picks cuda:LOCAL_RANK itself
