"""The training loop: plan -> model -> data -> steps -> metrics, checkpoints, W&B -> extrapolation eval.

The loop takes its part of the plan (:class:`TrainingPlan`, which experiment/plan.py builds from the config and
checks), never the config: each stage it runs takes its own settings (the optimizer's, the checkpointer's, the
metrics', the tracker's) and the evaluation at the end of training is handed in, ready to run.

What makes a run safe to stop, kill and continue:
- a checkpoint every train.checkpoint_every steps, at the end, and when SIGTERM, SIGINT or SIGUSR2 arrives
  (scheduler preemption or time limit, Ctrl-C); train.py then exits with 128 + the signal. Under torchrun
  the ranks stop together at the next multiple of train.log_every. A kill -9 loses at most
  train.checkpoint_every steps: checkpoints are written atomically (core/checkpoint_io.py).
  A run stopped during its end-of-training evaluation runs that evaluation when resumed.
- train.resume=true continues from <run_dir>/checkpoints/last.pt as if the run had never stopped: the same
  weights, optimizer moments, schedule, RNG and batches (the sampler's generator state), and metrics.jsonl
  cut back to the checkpoint. On CPU the loss sequence is bit-identical to an uninterrupted run.
- a non-finite loss stops the run with a clear error (or, with train.skip_nonfinite=true, skips the step),
  and weights that are not finite are never saved, so last.pt stays the last good checkpoint.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

from core.checkpoint_io import last_checkpoint_path, load_weights
from core.cli import kept_console, tee_console
from core.domain import choice, domain, read_with
from core.errors import PosGPTError
from core.host_memory import available_bytes, reused_freed_memory
from core.rundir import CONSOLE_LOG, lock_run
from core.runtime import MAX_SEED, autocast, compile_enabled, set_up_runtime
from core.tracking import TrackerSettings, init_wandb
from data import TokenArray, check_documents, check_split_length, draw_batch, load_splits, separate_documents
from data.config import DataConfig
from data.tasks import NO_TASK, TaskConfig, build_task, held_out_seed
from data.windows import PoSEConfig
from model import GPT, ModelConfig
from model.documents import within_document_index
from model.pe import PEConfig
from training import distributed
from training.batch_stream import BatchStream, rank_rows
from training.checkpointing import Checkpointer, CheckpointSettings, resume_checkpoint
from training.init_from import Parent
from training.metrics import MetricsSettings, MetricsWindow, finite
from training.optim import OptimizerSettings, build_optimizer, build_scheduler
from training.settings import BENCHMARKED, EVERY_COMMAND, RunLength
from training.step import TrainStep


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The model a run trains: model/'s constructor's arguments, and its size (counted by the planner on the meta
    device)."""

    model: ModelConfig
    pe: PEConfig
    train_seq_len: int
    num_params: int

    def build(self) -> GPT:
        # Copies: a model may keep its configs, and the plan's stay as planned.
        return GPT(copy.deepcopy(self.model), copy.deepcopy(self.pe), train_seq_len=self.train_seq_len)


COMPILE_SETTINGS = ("auto", "true", "false")  # train.compile's words, in any case (core.runtime.compile_enabled)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopSettings(RunLength):
    """What the loop itself reads: the ``train.*`` settings declared here (training/settings.py), with
    ``train.max_steps``, and, without a default, what the planner passes in from other sections."""

    # training context length: the "1x" of every extrapolation result, and the length a learned table holds
    seq_len: int = domain(64, ge=1, commands=EVERY_COMMAND)
    # sequences per optimizer step, over all processes and accumulation steps; 4 keeps the default job small enough
    # for a CPU (scripts/study.sh trains its studies at 8)
    batch_size: int = domain(4, ge=1, commands=BENCHMARKED)
    grad_accum_steps: int = domain(1, ge=1, commands=BENCHMARKED)
    grad_clip: float = domain(1.0, ge=0, commands=("train", "speed"))  # 0 disables clipping
    log_every: int = domain(10, ge=1)
    val_every: int = domain(200, ge=1)
    val_batches: int = domain(20, ge=1)
    checkpoint_every: int = domain(400, ge=1)
    # every command sets up its runtime from these (core.runtime.set_up_runtime, which the loop calls with these
    # settings), all but compile, which training alone reads
    seed: int = domain(1337, ge=0, le=MAX_SEED, commands=EVERY_COMMAND)
    device: str = read_with("auto", commands=EVERY_COMMAND)  # auto | cpu | cuda | cuda:N
    dtype: str = choice(
        "auto", ("auto", "float32", "bfloat16"), commands=EVERY_COMMAND
    )  # auto: bf16 on CUDA, fp32 on CPU
    # auto (on for CUDA) | true | false, in any case (Hydra makes a typed true/false "True"/"False"): refused
    # otherwise by check, since a choice's words match exactly
    compile: str = read_with("auto", commands=("train", "speed"))
    num_threads: int = domain(0, ge=0, commands=EVERY_COMMAND)  # CPU threads for torch; 0 keeps torch's default
    skip_nonfinite: bool = False  # skip steps whose loss is NaN/inf instead of stopping
    distributed: str = choice("ddp", ("ddp", "fsdp"))  # only used under torchrun
    # run the extrapolation eval when training ends: the planner then hands the loop that evaluation to run
    # (TrainingPlan.evaluation; None without it)
    eval_after: bool = True
    # randomized positions (Ruoss et al. 2023): train at sorted random positions from [0, N) (and evaluate a task
    # run there: eval.random_positions)
    random_positions: int | None = domain(None, ge=1, commands=("train", "eval", "estimate"))
    # PoSE (Zhu et al. 2024): train windows of seq_len tokens at chunks of positions skipped to cover
    # pose.target_len, to fine-tune for that length at this one (data/windows.py, pose_positions)
    pose: PoSEConfig = dataclasses.field(default_factory=PoSEConfig)
    document_aware: bool  # data.document_aware
    progress: bool  # logging.progress

    def check(self) -> None:
        """train.compile is one of its words; the positions a training window is given: train.random_positions'
        range and PoSE's settings (data/windows.py, given train.seq_len), one of the two."""
        if str(self.compile).lower() not in COMPILE_SETTINGS:
            raise PosGPTError(f"train.compile must be auto, true or false (got {self.compile!r})")
        if self.random_positions is not None and self.random_positions < self.seq_len:
            raise PosGPTError(
                f"train.random_positions={self.random_positions} must be at least train.seq_len={self.seq_len} "
                "(each sequence draws seq_len distinct positions from [0, N))"
            )
        self.pose.check(self.seq_len)
        position_draw(self.random_positions, self.pose.target_len)


def position_draw(random_positions: int | None, pose_target_len: int | None) -> tuple[str, int] | None:
    """The train.* setting that draws each training window's positions, and N, their range [0, N):
    train.random_positions, or PoSE's train.pose.target_len (a chunk's skip reaches up to target_len - 1). None: a
    window sits at positions 0 to seq_len - 1 (or restarts at each document, data.document_aware). PosGPTError when
    both are set."""
    draws = [
        (f"train.{key}", n)
        for key, n in (("random_positions", random_positions), ("pose.target_len", pose_target_len))
        if n is not None
    ]
    if len(draws) > 1:
        raise PosGPTError(
            "train.pose.target_len and train.random_positions each draw a window's positions: use one of them"
        )
    return draws[0] if draws else None


class EndEvaluation(Protocol):
    """The evaluation at the end of training (train.eval_after), as the planner hands it to the loop."""

    def check_split(self, val_tokens: TokenArray) -> None:
        """PosGPTError when it would score nothing of ``val_tokens``: checked before the run directory is written."""

    def done(self, run_dir: Path, step: int, trained: dict) -> bool:
        """Whether ``run_dir`` holds this evaluation of ``step``, the run having been trained (and so evaluated at
        its end) with the config ``trained``."""

    def run(
        self,
        model: torch.nn.Module,
        run_dir: Path,
        device: torch.device,
        dtype: torch.dtype,
        val_tokens: TokenArray | None,
        step: int,
        trained: dict,
        wandb_run: Any,
    ) -> None:
        """Evaluate ``model``, trained ``step`` steps with the config ``trained``, into ``run_dir``."""


@dataclasses.dataclass(frozen=True)
class TrainingPlan:
    """The training's part of the plan: the settings of each stage the loop runs."""

    loop: LoopSettings
    model: ModelSpec
    optimizer: OptimizerSettings
    checkpoint: CheckpointSettings
    metrics: MetricsSettings
    tracker: TrackerSettings
    data: DataConfig
    task: TaskConfig  # its name is data.tasks.NO_TASK for a language-model run
    parent: Parent | None = None  # train.init_from's run, read and checked by the planner
    evaluation: EndEvaluation | None = None  # None: train.eval_after=false


class StopRequested:
    """While active, SIGTERM, SIGINT and SIGUSR2 ask the loop to checkpoint and stop after the current step.

    SIGTERM: preemption or the end of a SLURM time limit; SIGINT: Ctrl-C; SIGUSR2: submitit's warning,
    signal_delay_s before a SLURM time limit (configs/hydra/launcher/slurm.yaml). A second signal acts as
    usual (quit at once): the previous handlers are back after the first one, and outside the loop (data
    loading, the final evaluation), where nothing unsaved can be lost.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)

    def __enter__(self) -> StopRequested:
        self.signal: int | None = None
        self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc_info) -> None:
        self._restore()

    def _handle(self, signum: int, frame) -> None:
        self.signal = signum
        self._restore()

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def __bool__(self) -> bool:
        return self.signal is not None


@torch.no_grad()
def estimate_val_loss(
    model: torch.nn.Module,
    tokens,
    settings: LoopSettings,
    task: bool,
    device: torch.device,
    dtype: torch.dtype,
    dist: distributed.DistInfo,
) -> float:
    """Mean loss on the same val_batches x batch_size windows (or task examples) every time: a fixed-seed
    generator, for a task a stream held out from training's (seeded apart from train.seed). Windows of the stream as
    they are, documents crossing, with or without data.document_aware, as the evaluation scores them."""
    model.eval()
    generator = torch.Generator().manual_seed(held_out_seed(settings.seed, "val") if task else 0)
    rows = rank_rows(settings.batch_size, dist)
    total = torch.zeros((), device=device)
    for _ in range(settings.val_batches):
        x, y = draw_batch(tokens, settings.batch_size, settings.seq_len, generator)
        with autocast(device, dtype):
            total += model(x[rows].to(device), y[rows].to(device)).float()
    model.train()
    return float(distributed.all_reduce_mean(total / settings.val_batches, dist))


def train(plan: TrainingPlan, run_dir: Path) -> int | None:
    """Train as planned; returns the signal that stopped the run early (after a checkpoint), else None. Every
    check of the config has run (experiment/plan.py); what is left needs the processes, the run directory's lock,
    its checkpoint or the data."""
    dist = distributed.init_distributed(plan.loop.device)
    try:
        run_dir = Path(distributed.broadcast_object(str(run_dir), dist))  # ${now:...} may differ across ranks
        with _run_dir_locked(run_dir, dist):
            return _train(plan, run_dir, dist)
    finally:
        distributed.shutdown(dist)


@contextlib.contextmanager
def _run_dir_locked(run_dir: Path, dist: distributed.DistInfo) -> Iterator[None]:
    """Hold the run directory's lock (core/rundir.py) while training: rank 0 takes it, as it alone writes there,
    and every rank stops if it cannot."""
    with contextlib.ExitStack() as stack:
        refusal = None
        if dist.is_main:
            try:
                stack.enter_context(lock_run(run_dir))
            except PosGPTError as error:
                refusal = error
        refusal = distributed.broadcast_object(refusal, dist)
        if refusal is not None:
            raise refusal
        yield


def _load_data(plan: TrainingPlan, dist: distributed.DistInfo) -> dict:
    """Tokenize once per node (local rank 0 goes first, the others then read its cache); only rank 0 prints.
    A task run has nothing to load: its task generates both streams (validation's from another seed)."""
    task = build_task(plan.task)
    if task is not None:
        return {"train": task, "val": task}
    progress = plan.loop.progress
    with contextlib.nullcontext() if dist.is_main else contextlib.redirect_stdout(io.StringIO()):
        if dist.local_rank == 0:
            splits = load_splits(plan.data, progress)
        distributed.barrier(dist)
        if dist.local_rank != 0:
            splits = load_splits(plan.data, progress)
    for tokens in splits.values():  # refused here, before the run directory is written, not at the first batch
        check_split_length(tokens, plan.loop.seq_len)
    if plan.loop.document_aware:
        check_documents(splits["train"], plan.data.name)
    if plan.evaluation is not None:
        plan.evaluation.check_split(splits["val"])
    return splits


def _check_memory_for_training(model: GPT, device: torch.device) -> None:
    """Training on the CPU adds to the weights their gradients and AdamW's two states, 12 bytes a parameter in
    fp32: refused here where the system has not that much left (core.host_memory.available_bytes), which would
    otherwise kill the process at the first step, with no line to say why."""
    available = available_bytes() if device.type == "cpu" else None
    params = model.num_params()
    if available is not None and params * 12 > available:
        raise PosGPTError(
            f"the model has {params:,} parameters: training it needs {params * 12 / 2**30:,.1f} GiB more for their "
            f"gradients and AdamW's states, and this machine has {available / 2**30:.1f} GiB available; lower its "
            "sizes (model.*, pe.*)"
        )


def _check_batch(settings: LoopSettings, dist: distributed.DistInfo) -> None:
    if settings.batch_size % (dist.world_size * settings.grad_accum_steps):
        raise PosGPTError(
            f"train.batch_size={settings.batch_size} (the global batch) must be divisible by the number of processes "
            f"({dist.world_size}) x train.grad_accum_steps ({settings.grad_accum_steps})"
        )


@dataclasses.dataclass
class _Prepared:
    """What every check before the run's first write has built: the model with the weights it starts from, the
    checkpoint it resumes (None: none), the data it trains on or evaluates."""

    device: torch.device
    dtype: torch.dtype
    raw_model: GPT
    checkpoint: dict | None
    finished: bool  # every step trained: the run only evaluates, if its evaluation has not finished
    idle: bool  # finished and evaluated: nothing to do
    splits: dict | None  # None when idle
    checkpointer: Checkpointer
    console: str  # what the data's loading printed, for the run's log


def _prepare(plan: TrainingPlan, run_dir: Path, dist: distributed.DistInfo) -> _Prepared:
    """Every check that needs the processes, the run directory's checkpoint, the model or the data, in the order
    the run makes them, writing nothing: the run then writes only once they have all passed, and
    ``train.py --check`` (:func:`rehearse`) makes the same checks."""
    _check_batch(plan.loop, dist)
    device, dtype = set_up_runtime(plan.loop, local_rank=dist.local_rank if dist.enabled else None)
    raw_model, checkpoint = _initial_model(plan, run_dir, device)
    finished = checkpoint is not None and checkpoint["step"] >= plan.loop.max_steps
    if not finished:  # a finished run only evaluates: no gradients or optimizer states
        _check_memory_for_training(raw_model, device)
    idle = finished and _nothing_to_do(plan, run_dir, checkpoint)
    splits = None
    with kept_console() as earlier:  # the data's lines, for the run's log once the data has passed its checks
        if not idle:  # a finished run's evaluation scores its validation split
            splits = _load_data(plan, dist)
    checkpointer = Checkpointer(plan.checkpoint, plan.optimizer, run_dir, checkpoint, dist, device)
    if not finished and plan.task.name == NO_TASK:  # a resumed run's corpus is its checkpoint's, or refused
        checkpointer.track_corpus(splits, checkpoint, plan.data)
    if not finished:
        _check_first_forward(plan.loop, raw_model, splits["train"], checkpoint, dist, (device, dtype), checkpointer)
    return _Prepared(device, dtype, raw_model, checkpoint, finished, idle, splits, checkpointer, earlier.getvalue())


def rehearse(plan: TrainingPlan, run_dir: Path) -> None:
    """Every check the run would make before its first write, in one process, writing nothing
    (``train.py --check``): the data loaded and checked, the model built with its starting weights, and the first
    micro-batch's forward pass. PosGPTError where the run would refuse. Quiet: what the data's loading says is the
    run's to print."""
    dist = distributed.init_distributed(plan.loop.device)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            _prepare(plan, run_dir, dist)
    finally:
        distributed.shutdown(dist)


def _train(plan: TrainingPlan, run_dir: Path, dist: distributed.DistInfo) -> int | None:
    ready = _prepare(plan, run_dir, dist)
    if ready.idle:
        _say_nothing_to_do(plan, run_dir, ready.checkpoint["step"], dist)
        return None  # and nothing was written
    device, dtype, raw_model, checkpoint = ready.device, ready.dtype, ready.raw_model, ready.checkpoint
    checkpointer, splits = ready.checkpointer, ready.splits
    # Every check has passed: only now does this command write into the run directory.
    checkpointer.record_run()
    if dist.is_main:
        tee_console(run_dir / CONSOLE_LOG, ready.console)
    if ready.finished:
        return _finish_trained(plan, run_dir, checkpoint, raw_model, splits["val"], dist, (device, dtype))

    loop = _set_up_loop(plan, run_dir, raw_model, checkpoint, checkpointer, splits, dist, device, dtype)
    with reused_freed_memory():  # each step's large tensors reuse the last step's memory (core/host_memory.py)
        step, stopped_by = _run_loop(loop)

    if stopped_by is not None and dist.is_main:
        print(
            f"train: stopped by {signal.Signals(stopped_by).name} at step {step}; checkpoint saved. "
            "Continue with train.resume=true",
            flush=True,
        )
    elif stopped_by is None and plan.evaluation is not None:
        _evaluate(plan, raw_model, loop.optimizer, splits["val"], run_dir, device, dtype, dist, loop.window.wandb_run)
    loop.window.finish()
    return stopped_by


@dataclasses.dataclass
class _Loop:
    """What the training steps use, built once every check has passed and the data is loaded."""

    settings: LoopSettings
    task: bool  # a task run: its validation stream is held out by seed
    dist: distributed.DistInfo
    device: torch.device
    dtype: torch.dtype
    checkpointer: Checkpointer
    raw_model: GPT  # the weights the checkpoints hold, unwrapped and uncompiled
    eager: torch.nn.Module  # raw_model as the processes share it (DDP, FSDP), uncompiled
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    batches: BatchStream
    step_fn: TrainStep
    window: MetricsWindow
    val_tokens: Any
    start_step: int


def _set_up_loop(
    plan: TrainingPlan,
    run_dir: Path,
    raw_model: GPT,
    checkpoint: dict | None,
    checkpointer: Checkpointer,
    splits: dict,
    dist: distributed.DistInfo,
    device: torch.device,
    dtype: torch.dtype,
) -> _Loop:
    """The optimizer, schedule, batches and metrics, restored from the checkpoint when resuming."""
    t = plan.loop
    eager = distributed.wrap_model(raw_model, dist, t.distributed, device)
    optimizer = build_optimizer(raw_model, plan.optimizer, device)
    scheduler = build_scheduler(optimizer, plan.optimizer)
    start_step = checkpointer.restore(checkpoint, raw_model, optimizer, scheduler) if checkpoint else 0
    batches = _batch_stream(t, splits["train"], checkpoint, dist, device)
    step_fn = _train_step(t, eager, optimizer, scheduler, device, dtype)
    window = MetricsWindow(plan.metrics, plan.tracker, run_dir, start_step, checkpoint, raw_model, dist, device, dtype)
    checkpointer.wandb_run_id = window.wandb_run_id
    if plan.parent is not None and checkpoint is None:
        window.write(plan.parent.record())  # the run records its parent
    window.record_runtime(start_step)
    return _Loop(
        settings=t,
        task=plan.task.name != NO_TASK,
        dist=dist,
        device=device,
        dtype=dtype,
        checkpointer=checkpointer,
        raw_model=raw_model,
        eager=eager,
        optimizer=optimizer,
        scheduler=scheduler,
        batches=batches,
        step_fn=step_fn,
        window=window,
        val_tokens=splits["val"],
        start_step=start_step,
    )


def _batch_stream(
    settings: LoopSettings, train_tokens, checkpoint: dict | None, dist: distributed.DistInfo, device: torch.device
) -> BatchStream:
    """The training batches, continuing the checkpoint's sampler when resuming."""
    return BatchStream(
        train_tokens,
        settings.batch_size,
        settings.seq_len,
        settings.seed,
        dist,
        device,
        state=checkpoint["sampler_state"] if checkpoint else None,
        random_positions=settings.random_positions,
        pose=settings.pose,
    )


def _train_step(
    settings: LoopSettings,
    eager: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    device: torch.device,
    dtype: torch.dtype,
) -> TrainStep:
    """One optimizer step of the model, compiled as train.compile says."""
    compiling = compile_enabled(settings.compile, device.type)
    # A compilation that fails at the first step falls back to the eager model (training/step.py).
    model = torch.compile(eager) if compiling else eager
    return TrainStep(
        model,
        optimizer,
        scheduler,
        settings.grad_accum_steps,
        settings.grad_clip,
        device,
        dtype,
        eager if compiling else None,
    )


def _run_loop(loop: _Loop) -> tuple[int, int | None]:
    """Train up to train.max_steps or until a signal stops the run; returns the last step and that signal."""
    t, dist, device = loop.settings, loop.dist, loop.device
    loop.eager.train()
    step, stopped_by = loop.start_step, None
    with StopRequested() as stop:
        while step < t.max_steps and stopped_by is None:
            x, y, positions = loop.batches.next()  # positions: None unless train.random_positions or train.pose
            documents = None
            if t.document_aware:  # each window's documents kept apart (data/windows.py)
                documents, y = separate_documents(x, y)
                positions = within_document_index(documents)  # given, not computed inside a compiled model
            loss, grad_norm, skipped = loop.step_fn(
                x, y, skip_nonfinite=t.skip_nonfinite, positions=positions, documents=documents
            )
            step += 1
            if step == 1:
                _check_first_loss(loss, loop)
            if step == loop.start_step + 1:  # a kernel that failed at this step was given up: record what runs now
                loop.window.recheck_runtime(step)
            loop.window.add(step, loss, skipped)
            stopped_by = _agreed_stop(stop, dist, step, t.log_every, device)
            _end_step(loop, step, grad_norm, stopping=stopped_by is not None)
        if stopped_by is None:  # a signal during the last step or its save: saved, but the evaluation is skipped
            stopped_by = _agreed_stop(stop, dist, step, 1, device)
    loop.window.close()
    return step, stopped_by


def _check_first_forward(
    settings: LoopSettings,
    model: GPT,
    train_tokens,
    checkpoint: dict | None,
    dist: distributed.DistInfo,
    runtime: tuple[torch.device, torch.dtype],
    checkpointer: Checkpointer,
) -> None:
    """One forward pass of the first micro-batch the run trains on, before the run directory is written: a forward
    that overflows (a non-finite loss) or an attention path this machine cannot run (its kernel's own refusal) is
    refused here, not at the first step. The batch comes from a stream of its own, the pass runs in eval mode, with
    no backward, on a copy of the random state, so the run trains exactly as it would without it."""
    device, dtype = runtime
    x, y, positions = _batch_stream(settings, train_tokens, checkpoint, dist, device).next()
    documents = None
    if settings.document_aware:
        documents, y = separate_documents(x, y)
        positions = within_document_index(documents)
    rows = max(1, len(x) // settings.grad_accum_steps)
    first = [None if t is None else t[:rows] for t in (x, y, positions, documents)]
    was_training = model.training
    model.eval()
    try:
        cuda = [device] if device.type == "cuda" else []
        # with gradients recorded, as training's forward: a path that only training refuses is refused too
        with torch.enable_grad(), torch.random.fork_rng(devices=cuda), autocast(device, dtype):
            loss = model(first[0], first[1], positions=first[2], documents=first[3]).detach()
    finally:
        model.train(was_training)
    if distributed.any_rank(not bool(torch.isfinite(loss)), dist, device):
        raise _overflow(checkpointer.overrides)


def _check_first_loss(loss: torch.Tensor, loop: _Loop) -> None:
    """Step 1's loss is that of the weights the run starts from, before any update: non-finite there, the forward
    pass overflows with these settings. A lower learning rate cannot mend that, and skipping steps would skip every
    one and end with nothing trained and exit 0. (_check_first_forward refuses most such runs before they start;
    this catches what only training mode computes.)"""
    if distributed.any_rank(not bool(torch.isfinite(loss)), loop.dist, loop.device):
        raise _overflow(loop.checkpointer.overrides)


def _overflow(overrides: tuple[str, ...]) -> PosGPTError:
    given = [o for o in overrides if o.startswith(("model", "pe", "train.init_from"))]
    sets = f" (this command sets {', '.join(given)})" if given else ""
    return PosGPTError(
        "the training loss is non-finite at step 1, before any update: the model's forward pass overflows with "
        f"these settings{sets}; neither a lower train.lr nor train.skip_nonfinite can mend that"
    )


def _end_step(loop: _Loop, step: int, grad_norm: torch.Tensor, stopping: bool) -> None:
    """After a step: its metrics (at logging and validation intervals), the check that the loss is finite, and
    the checkpoint (at its interval, at the last step, and when the run is stopping)."""
    t = loop.settings
    last = step == t.max_steps
    record = (
        loop.window.close_window(step, loop.scheduler.get_last_lr()[0], grad_norm)
        if (step % t.log_every == 0 or last or stopping)
        else {}
    )
    if step % t.val_every == 0 or last:
        model, tokens = loop.step_fn.model, loop.val_tokens
        val_loss = estimate_val_loss(model, tokens, t, loop.task, loop.device, loop.dtype, loop.dist)
        record = {"step": step, **record, "val_loss": val_loss}
    loop.window.write(record)
    if not finite(record) and not t.skip_nonfinite:  # alike on every rank: the loss is averaged over them
        raise PosGPTError(
            f"the training loss became non-finite by step {step}; {loop.checkpointer.kept()}. "
            f"Lower train.lr (now {loop.checkpointer.optimizer_settings.lr}), or pass train.skip_nonfinite=true to "
            "skip such steps"
        )
    if step % t.checkpoint_every == 0 or last or stopping:
        loop.checkpointer.save(step, loop.raw_model, loop.optimizer, loop.scheduler, loop.batches.sampler_state)


def _initial_model(plan: TrainingPlan, run_dir: Path, device: torch.device) -> tuple[GPT, dict | None]:
    """The model and where its weights come from: the checkpoint to resume (train.resume), else the parent run's
    weights (train.init_from), else its initialisation."""
    model = plan.model.build().to(device)
    checkpoint = resume_checkpoint(plan.checkpoint, run_dir)
    if checkpoint is not None:  # checked whole here, before anything is written (Checkpointer.restore loads it again)
        load_weights(model, checkpoint["model"], last_checkpoint_path(run_dir))
        return model, checkpoint
    if plan.parent is not None:
        plan.parent.load_into(model, plan.loop.seq_len)
    return model, None


def _finish_trained(
    plan: TrainingPlan,
    run_dir: Path,
    checkpoint: dict,
    model: torch.nn.Module,
    val_tokens,
    dist: distributed.DistInfo,
    runtime: tuple[torch.device, torch.dtype],
) -> None:
    """Resuming a run that has trained all its steps, and whose end-of-training evaluation never finished (it was
    stopped, or it was stopped at the last step): run that evaluation."""
    step = checkpoint["step"]
    if dist.is_main:
        print(
            f"train: {run_dir} has trained {step} steps, but its end-of-training evaluation did not finish, or not at "
            "every length and evaluator this command asks for: running it",
            flush=True,
        )
    device, dtype = runtime  # the model holds the checkpoint's weights (_initial_model)
    if dist.is_main:
        wandb_run = init_wandb(plan.tracker, run_dir, checkpoint.get("wandb_run_id"))
        plan.evaluation.run(model, run_dir, device, dtype, val_tokens, step, checkpoint["config"], wandb_run)
        if wandb_run is not None:
            wandb_run.finish()
    return None


def _nothing_to_do(plan: TrainingPlan, run_dir: Path, checkpoint: dict) -> bool:
    """Whether a run that has trained all its steps has also been evaluated as planned (or is not to be)."""
    return plan.evaluation is None or plan.evaluation.done(run_dir, checkpoint["step"], checkpoint["config"])


def _say_nothing_to_do(plan: TrainingPlan, run_dir: Path, step: int, dist: distributed.DistInfo) -> None:
    """The command says so and changes nothing, not even the run's record of its latest start or its console log."""
    if dist.is_main:
        print(
            f"train: {run_dir} has already trained {step} steps (train.max_steps={plan.loop.max_steps}); nothing to "
            "do. Raise train.max_steps to train longer",
            flush=True,
        )


def _evaluate(
    plan: TrainingPlan,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    val_tokens,
    run_dir: Path,
    device: torch.device,
    dtype: torch.dtype,
    dist: distributed.DistInfo,
    wandb_run,
) -> None:
    """The extrapolation eval, on rank 0 alone: with FSDP it gets an unsharded copy of the model (the same
    memory eval.py needs)."""
    if dist.enabled and plan.loop.distributed == "fsdp":
        state, _ = distributed.full_state_dicts(model, optimizer)
        if dist.is_main:
            model = plan.model.build().to(device)
            model.load_state_dict(state)
    if dist.is_main:
        # the config the checkpoints of this run hold (Checkpointer saves the same)
        trained, step = plan.checkpoint.config, plan.loop.max_steps
        plan.evaluation.run(model, run_dir, device, dtype, val_tokens, step, trained, wandb_run)


def _agreed_stop(
    stop: StopRequested, dist: distributed.DistInfo, step: int, every: int, device: torch.device
) -> int | None:
    """The signal that stops the run now, None to go on. Single process: stop at once. Several processes must stop
    at the same step, so they agree at logging intervals (one tiny all-reduce: a signal waits at most log_every
    steps), each taking the signal a rank received (ranks that received none stop too)."""
    if not dist.enabled:
        return stop.signal
    if step % every:
        return None
    return distributed.max_over_ranks(stop.signal or 0, dist, device) or None
