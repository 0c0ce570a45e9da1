"""The fine-tuned context-extension study: parents trained at L, fine-tuned to factor x L, scored at 1-16x L.

    python scripts/extension_study.py runs/ext                          # 3 seeds, budgets 20 and 200 steps, 4x
    python scripts/extension_study.py runs/ext --seed-list 4,5          # more seeds into the same study
    python scripts/extension_study.py runs/ext --list                   # the jobs, run none
    python scripts/extension_study.py runs/ext --part parents           # only the parents (then --part extensions)
    python scripts/extension_study.py runs/task --task passkey          # the same design on passkey retrieval
    python scripts/extension_study.py /tmp/smoke --seeds 1 --budgets 2 --methods plain,drope train.max_steps=3
    python scripts/extension_study.py runs/ext --methods drope,pose,pose_yarn   # DroPE as its paper, PoSE
    python scripts/extension_study.py runs/ext --methods yarn,training-free   # some methods (default: all)

The design is a table, scripts/extension_study.json (scheme names live in data, as in study_variations.json):

- parents, at train.seq_len L (the overrides' or the default's), one per seed: ``rope-<L>-s<seed>`` and
  ``nope-<L>-s<seed>`` (NoPE trained from scratch, the same budget);
- fine-tunes of each RoPE parent to factor x L, ``<method>-<steps>-s<seed>`` for each budget in steps: plain (no
  scaling), pi (linear), ntk, yarn, llama3 (Llama 3.1's frequency factors, the code's defaults 1 and 4), longrope
  (short_factor all 1, the model as trained up to L; long_factor YaRN's per-pair divisors at the same factor, the
  starting point of LongRoPE's search, which posgpt does not run), drope_4l (the rotation dropped, pe=none with
  train.init_from_pe=replace, recalibrated as the others fine-tune: at factor x L, lr 2e-4), drope (DroPE as its
  paper runs it: recalibrated at the parent's own L and learning rate, scored zero-shot at 1-16x L without and,
  in the evaluations stage, with its temperature model.attn_temperature.type=drope), pose and pose_yarn (PoSE,
  train.pose: at the parent's L with positions covering factor x L; alone and with YaRN at the factor). Each
  takes train.init_from=<its parent>, train.seq_len=factor x L, train.max_steps=<steps>, lr 2e-4 and a warmup of
  steps/10 (at most 20), as docs/fine-tuning.md's example (20 of 300 steps), unless its own overrides in the
  design set its length or lr; a scaling keeps the parent's L as its original length (RoPE's inherit);
- the training-free methods on each RoPE parent (--methods's ``training-free``), ``training-free-s<seed>``:
  eval.py with the variations yarn and ntk at the study's factor, STRING with window W = L/2 and local window
  w = L/16 (at least 1), and Self-Extend with window W and the smallest power-of-two group that maps 16L's farthest
  distance inside L. The parent's own row (no variation) is its end-of-training evaluation, which scored the same
  lengths and targets.

Every run is scored at L, 2L, 4L, 8L and 16L (absolute eval.lengths: parents and fine-tunes score the same lengths
and, for perplexity, the same targets; eval.max_tokens at least 32 windows of 16L). The language-model runs
train with 8 sequences a step as scripts/study.sh's; a task run (--task) takes the task's model and schedule and
trains on every length up to its own train.seq_len (task.train_lengths=uniform), so a fine-tune trains up to
factor x L.

Stages: every parent is planned (train.py's planner, in this process) before the first one trains; every
extension job (fine-tunes and training-free evaluations) is planned once the parents exist, before the first
fine-tune trains; the fine-tunes' further evaluations (the design's zero_shot, ``<fine-tune>-<label>``) once the
fine-tunes exist (--part extensions runs both of these stages). A refusal names its job in one line (exit 2) and
nothing of that stage runs; so does a directory that holds a run trained with other settings than its job's (an
earlier design's). Resumable: a run whose checkpoint is at its max_steps and whose end-of-training results record
that step is skipped; one with a checkpoint short of that resumes (train.resume=true); a parent's training-free
variations are evaluated only where its eval/.variations-done (scripts/study.sh's marker) lacks them, a further
evaluation only where its marker (eval/.<label>-done) does not record the run's step. At the end
scripts/compare.py compares every finished run of the directory: comparison.md/.png (perplexity, --ratios;
comparison_sliding.md where the runs scored that protocol), or comparison_tasks.md/.png/.csv and
comparison_tasks_heatmap.png for a task.

Overrides after the options apply to every run; the study's own keys (pe, pe.*, task, train.seed,
train.init_from*, train.resume, train.pose.*, hydra.*) are refused there, and a fine-tune's length, steps, lr and
warmup are the design's (train.max_steps, train.lr, train.warmup_steps given here set the parents' schedule, and
DroPE's lr, the parent's).
"""

from __future__ import annotations

import _repo  # noqa: F401  (the repository's packages on sys.path)

import argparse
import importlib
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.cli import ArgumentParser, count, exit_on_user_error
from core.config_keys import overridden_keys
from core.errors import PosGPTError
from core.files import read_json

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from training.loop import TrainingPlan

ROOT = Path(__file__).resolve().parents[1]
DESIGN: dict[str, Any] = json.loads(Path(__file__).with_name("extension_study.json").read_text())
MULTIPLIERS = (1, 2, 4, 8, 16)  # the evaluated lengths, in multiples of L
WINDOWS_AT_LONGEST = 32  # eval.max_tokens: at least this many windows of the longest length
# Keys the design sets per job: an override of them for every run would break the design.
STUDY_KEYS = ("pe", "task", "train.seed", "train.init_from", "train.init_from_pe", "train.resume", "train.eval_after")
STUDY_KEYS += ("hydra", "train.pose")
VARIATIONS_DONE = Path("eval") / ".variations-done"  # scripts/study.sh's marker of the variations a run has
TRAINING_FREE = "training-free"  # the --methods name of the training-free evaluations of each parent
STAGES = ("parents", "extensions", "evaluations")  # evaluations: of the fine-tunes, once they are trained
PARTS = {"parents": STAGES[:1], "extensions": STAGES[1:], "all": STAGES}  # --part: the stages it runs


@dataclass(frozen=True)
class Job:
    """One unit of the study: a training run (train.py with ``overrides`` into ``run_dir``), or, with
    ``variations``, an evaluation of the trained run ``run_dir`` with those eval.variations (eval.py), or, with
    ``evaluation``, an evaluation of the trained run with those settings (the design's ``zero_shot``: DroPE's
    temperature), noted as done for the run's step in ``marker``."""

    name: str
    stage: str  # one of STAGES
    run_dir: Path
    overrides: tuple[str, ...]
    variations: tuple[str, ...] = ()
    evaluation: tuple[str, ...] = ()
    marker: Path | None = None  # an evaluation's: the file, in the run, that records the step it scored
    method: str = ""  # a fine-tune's, of the design's fine_tunes

    def evaluation_overrides(self) -> list[str]:
        """An evaluation's eval.py overrides ([] for a training job)."""
        if self.variations:
            return [f"eval.variations=[{','.join(self.variations)}]"]
        return list(self.evaluation)

    def command(self) -> list[str]:
        """The command line that runs the job (without train.resume, which the run's state decides)."""
        if self.variations or self.evaluation:
            return ["eval.py", f"run_dir={self.run_dir}", *self.evaluation_overrides()]
        return ["train.py", *self.overrides, f"hydra.run.dir={self.run_dir}"]


def merged(*layers: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The overrides of every layer, a later layer's value of a key replacing an earlier one's."""
    by_key: dict[str, str] = {}
    for layer in layers:
        for key, override in zip(overridden_keys(layer), layer, strict=True):
            by_key.pop(key, None)
            by_key[key] = override
    return tuple(by_key.values())


def check_user_overrides(overrides: list[str]) -> None:
    """PosGPTError for an override of a key the design sets per job, or one that is not KEY=VALUE."""
    for override in overrides:
        if "=" not in override:
            raise PosGPTError(f"{override!r} is not a Hydra override KEY=VALUE (options come as --name VALUE)")
        (key,) = overridden_keys([override])
        if any(key == name or key.startswith(f"{name}.") or key.startswith(f"{name}/") for name in STUDY_KEYS):
            raise PosGPTError(
                f"{override}: the study sets {key} itself for each job (its design, scripts/extension_study.json, "
                "and its options: --task, --seeds); drop it"
            )


def yarn_divisors(head_dim: int, base: float, train_len: int, factor: float) -> list[float]:
    """theta_i / theta'_i of YaRN at ``factor`` for each of the head's head_dim/2 pairs (the paper's betas 32 and 1,
    the ramp over the pair index as the authors' code and model/pe/'s scaling): 1 for the pairs that turn more than
    32 times over L, ``factor`` for those that turn less than once, a ramp in 1/divisor between. LongRoPE's search
    starts from these."""

    def pair_index(turns: float) -> float:  # the fractional pair that turns this many times over L
        return head_dim * math.log(train_len / (2 * math.pi * turns)) / (2 * math.log(base))

    fast = max(math.floor(pair_index(32.0)), 0)
    slow = min(math.ceil(pair_index(1.0)), head_dim - 1)
    divisors = []
    for pair in range(head_dim // 2):
        interpolated = min(max((pair - fast) / max(slow - fast, 1e-3), 0.0), 1.0)
        divisors.append(1.0 / (interpolated / factor + 1.0 - interpolated))
    return divisors


def self_extend_group(train_len: int, window: int, longest: int) -> int:
    """The smallest power-of-two group G under which Self-Extend maps the farthest distance of a ``longest``-token
    window inside the training length: floor((longest - 1) / G) + W - floor(W / G) < L."""
    group = 2
    while (longest - 1) // group + window - window // group >= train_len:
        group *= 2
    return group


def placeholders(cfg: DictConfig, factor: int) -> dict[str, str]:
    """The values the design's templates name, from the composed parent config ``cfg`` (L, its learning rate, the
    head's width, the scheme's base) and the extension factor."""
    train_len = cfg.train.seq_len
    head_dim = cfg.model.n_embd // cfg.model.n_head
    window = max(train_len // 2, 1)
    divisors = yarn_divisors(head_dim, float(cfg.pe.base), train_len, factor)
    return {
        "factor": str(factor),
        "train_len": str(train_len),  # a method that fine-tunes at the parent's L (DroPE as its paper, PoSE)
        "target_len": str(factor * train_len),  # the length PoSE's positions cover
        "parent_lr": f"{cfg.train.lr:g}",  # DroPE's recalibration: at the parent's learning rate
        "window": str(window),
        "local_window": str(max(train_len // 16, 1)),
        "group": str(self_extend_group(train_len, window, MULTIPLIERS[-1] * train_len)),
        "unit_divisors": f"[{','.join(['1'] * (head_dim // 2))}]",
        "yarn_divisors": f"[{','.join(f'{d:.6g}' for d in divisors)}]",
    }


def filled(templates: list[str], values: dict[str, str]) -> list[str]:
    """The design's override templates with their {placeholders} filled in."""
    return [template.format(**values) for template in templates]


@dataclass(frozen=True)
class Study:
    """What the command line asks: the directory, seeds, budgets (fine-tuning steps), factor, task, methods, and the
    overrides of every run."""

    directory: Path
    seeds: tuple[int, ...]
    budgets: tuple[int, ...]
    factor: int
    task: str
    methods: tuple[str, ...]
    overrides: tuple[str, ...]

    def base(self, train_len: int) -> list[str]:
        """The study's settings of every run, which the command line's overrides may change: the task, or for
        language modelling scripts/study.sh's batch and enough evaluation tokens; the W&B group where W&B runs."""
        disabled = "logging.wandb.mode=disabled" in self.overrides  # then nothing reads a group
        group = [] if disabled else [f"logging.wandb.group={self.directory.resolve().name}"]
        if self.task != "none":
            return [f"task={self.task}", *group]
        max_tokens = max(32768, WINDOWS_AT_LONGEST * MULTIPLIERS[-1] * train_len)
        return ["train.batch_size=8", f"eval.max_tokens={max_tokens}", *group]

    def compose(self, *extra: str) -> DictConfig:
        """The config a run of the study's settings composes to (with ``extra`` last)."""
        from experiment.compose import compose_config

        task = [f"task={self.task}"] if self.task != "none" else []
        return compose_config([*task, *self.overrides, *extra])


def scored(train_len: int) -> list[str]:
    """What every training job of the study is scored with: its end-of-training evaluation at 1x .. 16x L."""
    return [f"eval.lengths=[{','.join(str(m * train_len) for m in MULTIPLIERS)}]", "train.eval_after=true"]


def parent_jobs(study: Study, train_len: int) -> list[Job]:
    """Each parent scheme of the design at each seed, trained at L with the overrides' schedule."""
    jobs = []
    for name, scheme in DESIGN["parents"].items():
        for seed in study.seeds:
            design = [*scheme, f"train.seed={seed}", f"train.seq_len={train_len}", *scored(train_len)]
            run = f"{name}-{train_len}-s{seed}"
            overrides = merged(study.base(train_len), study.overrides, design)
            jobs.append(Job(run, "parents", study.directory / run, overrides))
    return jobs


def fine_tune_jobs(study: Study, train_len: int, values: dict[str, str]) -> list[Job]:
    """Every fine-tune of each extended parent (method x budget x seed). A method's own overrides come after the
    design's defaults, the fine-tunes' length factor x L and schedule, so that it may set its own (DroPE
    recalibrates at the parent's L and learning rate), and before what the study fixes for every job."""
    extended = DESIGN["extended_parent"]
    jobs = []
    for method in (method for method in study.methods if method != TRAINING_FREE):
        for steps in study.budgets:
            schedule = filled(DESIGN["fine_tune_schedule"], {**values, "warmup": str(min(20, steps // 10))})
            for seed in study.seeds:
                parent = study.directory / f"{extended}-{train_len}-s{seed}"
                design = [
                    *schedule,
                    f"train.seq_len={study.factor * train_len}",
                    *filled(DESIGN["fine_tunes"][method], values),
                    f"train.seed={seed}",
                    f"train.init_from={parent}",
                    f"train.max_steps={steps}",
                    *scored(train_len),
                ]
                overrides = merged(study.base(train_len), study.overrides, design)
                name = f"{method}-{steps}-s{seed}"
                jobs.append(Job(name, "extensions", study.directory / name, overrides, method=method))
    return jobs


def zero_shot_jobs(fine_tunes: list[Job], values: dict[str, str]) -> list[Job]:
    """The design's further evaluations of a method's fine-tunes (``zero_shot``: DroPE scored with its
    temperature beside its end-of-training rows without it), ``<fine-tune>-<label>``, each of its trained run."""
    jobs = []
    for job in fine_tunes:
        for label, settings in DESIGN["zero_shot"].get(job.method, {}).items():
            marker = job.run_dir / "eval" / f".{label}-done"
            evaluation = tuple(filled(settings, values))
            jobs.append(Job(f"{job.name}-{label}", "evaluations", job.run_dir, (), (), evaluation, marker, job.method))
    return jobs


def extension_jobs(study: Study, train_len: int, values: dict[str, str]) -> list[Job]:
    """Every fine-tune of each extended parent, then, where --methods has them, the training-free evaluations of
    each; then the fine-tunes' further evaluations (a stage of their own, run once they are trained)."""
    fine_tunes = fine_tune_jobs(study, train_len, values)
    jobs = [*fine_tunes, *training_free_jobs(study, train_len, values)]
    return [*jobs, *zero_shot_jobs(fine_tunes, values)]


def training_free_jobs(study: Study, train_len: int, values: dict[str, str]) -> list[Job]:
    """eval.py with the design's training-free variations on each extended parent, where --methods has them."""
    extended = DESIGN["extended_parent"]
    jobs: list[Job] = []
    if TRAINING_FREE not in study.methods:
        return jobs
    variations = tuple(filled(DESIGN["training_free"], values))
    for seed in study.seeds:
        parent = study.directory / f"{extended}-{train_len}-s{seed}"
        jobs.append(Job(f"training-free-s{seed}", "extensions", parent, (), variations))
    return jobs


def study_jobs(study: Study) -> list[Job]:
    """Every job of the study, parents first, each with its complete overrides."""
    cfg = study.compose(*DESIGN["parents"][DESIGN["extended_parent"]])
    train_len = cfg.train.seq_len
    values = placeholders(cfg, study.factor)
    return [*parent_jobs(study, train_len), *extension_jobs(study, train_len, values)]


def check_every_config(jobs: list[Job]) -> None:
    """Every training job's config checked whole, as train.py checks it before it plans (experiment/plan.py,
    check_training_config), for every stage at once: a setting a later stage's job would refuse is refused before
    the first job trains, and before --list lists them; so is each evaluation of a run that a job trains, on that
    run's config (experiment/plan.py, check_later_evaluation). (What needs a parent's checkpoint, which an earlier
    stage makes, is planned with the job's stage: plan_stage.)"""
    from experiment.compose import compose_config, hydra_errors_as_user_errors
    from experiment.plan import check_later_evaluation, check_training_config

    trained = {job.run_dir: job for job in jobs if not (job.variations or job.evaluation)}
    evaluations = set()  # those planned: one of runs that differ only in their seed is planned once
    for job in jobs:
        try:
            with hydra_errors_as_user_errors():
                if not (job.variations or job.evaluation):
                    check_training_config(compose_config(list(job.overrides)))
                elif job.run_dir in trained:  # an evaluation of a run that an earlier stage trains
                    kept = trained[job.run_dir].overrides
                    keys = overridden_keys(kept)
                    training = tuple(o for o, key in zip(kept, keys, strict=True) if key != "train.seed")
                    evaluation = (training, tuple(job.evaluation_overrides()))
                    if evaluation not in evaluations:
                        check_later_evaluation(*map(list, evaluation))
                        evaluations.add(evaluation)
        except PosGPTError as error:
            raise type(error)(f"job {job.name} of the extension study: {error}") from None


def plan_stage(jobs: list[Job]) -> dict[str, TrainingPlan]:
    """Plan every job of a stage as its command would (train.py's planner, eval.py's), in this process and
    writing nothing: one refusal stops the stage before anything of it runs, naming its job. The training plans,
    by job name."""
    from experiment.compose import compose_config, hydra_errors_as_user_errors
    from experiment.plan import plan_training

    plans = {}
    for job in jobs:
        try:
            with hydra_errors_as_user_errors():
                if job.variations or job.evaluation:
                    settings = evaluation_left(job)
                    if settings:
                        importlib.import_module("eval").plan_evaluation(job.run_dir, settings)
                else:
                    plans[job.name] = plan_training(
                        compose_config(list(job.overrides)), list(job.overrides), job.run_dir
                    )
                    check_existing_run(job, plans[job.name])
        except PosGPTError as error:
            raise type(error)(f"job {job.name} of the extension study: {error}") from None
    return plans


def evaluation_left(job: Job) -> list[str]:
    """The eval.py overrides an evaluation job has still to run: its variations that the run's marker lacks, or
    its settings unless its marker records the run's step; [] when it is done."""
    if job.variations:
        missing = missing_variations(job)
        return [f"eval.variations=[{','.join(missing)}]"] if missing else []
    return [] if zero_shot_done(job) else list(job.evaluation)


def zero_shot_done(job: Job) -> bool:
    """Whether the run's marker of this evaluation records the step of its last checkpoint."""
    from core.checkpoint_io import last_checkpoint_path, load_checkpoint

    path = last_checkpoint_path(job.run_dir)
    if job.marker is None or not job.marker.exists() or not path.exists():
        return False
    return job.marker.read_text().strip() == str(load_checkpoint(path)["step"])


def check_existing_run(job: Job, plan: TrainingPlan) -> None:
    """PosGPTError when the job's directory holds a run trained with settings other than the job's (a run of an
    earlier design under the same name: DroPE recalibrated at factor x L is the method drope_4l now): it would be
    skipped as done, or refused when resumed."""
    from core.checkpoint_io import last_checkpoint_path, load_checkpoint
    from experiment.plan import resume_changes

    path = last_checkpoint_path(job.run_dir)
    if not path.exists():
        return
    changed = resume_changes(plan.checkpoint.config, load_checkpoint(path)["config"])
    # the parent's path is absolute: a study directory moved elsewhere holds the same runs
    changed = [change for change in changed if not change.startswith("train.init_from=")]
    if changed:
        raise PosGPTError(
            f"{job.run_dir} holds a run trained with {', '.join(changed[:3])}, not this job's settings (a run of "
            "an earlier design of the study?); move it away, or run the study into another directory"
        )


def missing_variations(job: Job) -> list[str]:
    """The job's variations that the run's eval/.variations-done (written once eval.py scored them) lacks."""
    marker = job.run_dir / VARIATIONS_DONE
    done = marker.read_text().strip().strip("[]").split(",") if marker.exists() else []
    return [variation for variation in job.variations if variation not in done]


def run_state(job: Job, plan: TrainingPlan) -> str:
    """ "done" (the checkpoint at train.max_steps, and every results file of its end-of-training evaluation records
    that step), "resume" (a checkpoint short of that), or "new" (no checkpoint)."""
    from core.checkpoint_io import last_checkpoint_path, load_checkpoint

    path = last_checkpoint_path(job.run_dir)
    if not path.exists():
        return "new"
    checkpoint = load_checkpoint(path)
    step, evaluation = checkpoint["step"], plan.evaluation
    done = evaluation is None or evaluation.done(job.run_dir, step, checkpoint["config"])
    if step >= plan.loop.max_steps and done:
        return "done"
    return "resume"


def run_command(job: Job, argv: list[str]) -> None:
    """Run ``python <argv>`` from the repository root; its failure ends the study with its exit status."""
    print(f"study: {job.name}: python {' '.join(argv)}", flush=True)
    status = subprocess.run([sys.executable, *argv], cwd=ROOT).returncode
    if status != 0:
        print(f"study: {job.name} stopped with exit status {status}; run the study again to resume it", file=sys.stderr)
        sys.exit(status)


def run_stage(jobs: list[Job], plans: dict[str, TrainingPlan]) -> None:
    """Run each planned job that has work left: train (or resume) a run, or evaluate a parent's missing
    variations and note them in its marker."""
    for job in jobs:
        if job.variations or job.evaluation:
            run_evaluation(job)
            continue
        state = run_state(job, plans[job.name])
        if state == "done":
            print(f"study: {job.name}: trained and evaluated; skipped", flush=True)
            continue
        run_command(job, [*job.command(), *(["train.resume=true"] if state == "resume" else [])])


def run_evaluation(job: Job) -> None:
    """Evaluate the job's run with what it has left (evaluation_left) and note it in its marker: the variations
    scored (scripts/study.sh's marker), or the step an evaluation's settings scored."""
    from core.checkpoint_io import last_checkpoint_path, load_checkpoint

    settings = evaluation_left(job)
    if not settings:
        print(f"study: {job.name}: {job.run_dir} has this evaluation; skipped", flush=True)
        return
    run_command(job, ["eval.py", f"run_dir={job.run_dir}", *settings])
    if job.variations:
        missing = missing_variations(job)
        done = [v for v in job.variations if v not in missing] + missing
        (job.run_dir / VARIATIONS_DONE).write_text(f"[{','.join(done)}]\n")
    else:
        job.marker.write_text(f"{load_checkpoint(last_checkpoint_path(job.run_dir))['step']}\n")


def compare(study: Study) -> None:
    """scripts/compare.py over every finished run of the directory: perplexity with ratios (and the sliding
    protocol where the runs scored it), or the task's accuracy."""
    results = "tasks.json" if study.task != "none" else "extrapolation.json"
    runs = sorted(str(path.parent.parent) for path in study.directory.glob(f"*/eval/{results}"))
    if not runs:
        print(f"study: no run in {study.directory} has results yet; nothing compared", flush=True)
        return
    out = study.directory
    script = str(ROOT / "scripts" / "compare.py")
    if study.task != "none":
        outputs = ["--markdown", out / "comparison_tasks.md", "--task-plot", out / "comparison_tasks.png"]
        outputs += ["--task-heatmap", out / "comparison_tasks_heatmap.png", "--task-csv", out / "comparison_tasks.csv"]
        commands = [[script, *runs, *outputs]]
    else:
        commands = [[script, *runs, "--ratios", "--markdown", out / "comparison.md", "--plot", out / "comparison.png"]]
        rows = read_json(Path(runs[0]) / "eval" / results)["results"]
        if any(row.get("protocol") == "sliding" for row in rows):  # eval.protocols may leave it out
            sliding = ["--protocol", "sliding", "--markdown", out / "comparison_sliding.md"]
            commands.append([script, *runs, "--ratios", *sliding, "--plot", out / "comparison_sliding.png"])
    for command in commands:
        status = subprocess.run([sys.executable, *map(str, command)], cwd=ROOT).returncode
        if status != 0:
            sys.exit(status)


def comma_list(kind: type, minimum: int) -> Any:
    """An argparse ``type``: comma-separated whole numbers >= ``minimum`` (or names, for ``kind`` str)."""

    def parse(text: str) -> tuple:
        items = tuple(item.strip() for item in text.split(",") if item.strip())
        if kind is str:
            return items
        return tuple(count(minimum)(item) for item in items)

    parse.__name__ = f"comma-separated whole numbers >= {minimum}" if kind is int else "comma-separated names"
    if kind is int:
        parse.minimum = minimum  # each number's domain edge, as core.cli.count declares its own
    return parse


def check_options_read(args: argparse.Namespace) -> None:
    """An option that no job of the stages and methods asked for reads is refused, naming what would read it:
    --budgets is read by the fine-tunes, --factor by the fine-tunes and the training-free methods, --methods by the
    extensions stage (--part parents runs only the parents), --task by the runs trained (the parents and the
    fine-tunes: the training-free methods evaluate each parent as it was trained)."""
    extending = "extensions" in PARTS[args.part]
    fine_tuning = args.methods is None or any(method != TRAINING_FREE for method in args.methods)
    readers = {
        "--budgets": (
            extending and fine_tuning,
            f"the fine-tunes (--part extensions or all, a method besides {TRAINING_FREE})",
        ),
        "--factor": (extending, "the fine-tunes and the training-free methods (--part extensions or all)"),
        "--methods": (extending, "the extensions stage (--part extensions or all)"),
        "--task": (
            "parents" in PARTS[args.part] or (extending and fine_tuning),
            f"the runs trained (--part parents or all, or a method besides {TRAINING_FREE})",
        ),
    }
    for option, (read, by) in readers.items():
        if getattr(args, option[2:]) is not None and not read:
            raise PosGPTError(f"{option} is read only by {by}; nothing this command runs reads it: drop it")


def parse_study(argv: list[str]) -> tuple[Study, bool, str]:
    """(the study, --list, --part) from the command line; PosGPTError for anything invalid."""
    parser = ArgumentParser(prog="scripts/extension_study.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    seeds = parser.add_mutually_exclusive_group()  # one of them: given both, --seeds would be unread
    seeds.add_argument("--seeds", type=count(1), default=3, help="seeds 1..N (default 3)")
    seeds.add_argument("--seed-list", type=comma_list(int, 0), help="these seeds instead, e.g. 4,5")
    parser.add_argument("--budgets", type=comma_list(int, 1), help="fine-tuning steps (20,200)")
    parser.add_argument("--factor", type=count(2), help="fine-tune to factor x L (default 4)")
    parser.add_argument("--task", help="none (language modelling, the default) or a task of configs/task/")
    methods = (*DESIGN["fine_tunes"], TRAINING_FREE)
    parser.add_argument("--methods", type=comma_list(str, 0), help=f"of {','.join(methods)} (all)")
    parser.add_argument("--part", choices=tuple(PARTS), default="all", help="the stages run (all)")
    parser.add_argument("--list", action="store_true", help="print the jobs, run none")
    args = parser.parse_intermixed_args(argv)
    check_options_read(args)
    args.task = "none" if args.task is None else args.task
    args.budgets = (20, 200) if args.budgets is None else args.budgets
    args.factor = 4 if args.factor is None else args.factor
    args.methods = methods if args.methods is None else args.methods
    unknown = [method for method in args.methods if method not in methods]
    if unknown or not args.methods:
        raise PosGPTError(f"--methods takes some of {','.join(methods)}, got {','.join(args.methods)}")
    if not args.budgets or not (args.seed_list is None or args.seed_list):
        raise PosGPTError("--budgets and --seed-list take at least one number")
    if args.task != "none" and not (ROOT / "configs" / "task" / f"{args.task}.yaml").is_file():
        raise PosGPTError(f"--task takes none or a task of configs/task/, got {args.task!r}")
    check_user_overrides(args.overrides)
    seeds = args.seed_list or tuple(range(1, args.seeds + 1))
    overrides = tuple(args.overrides)
    study = Study(args.directory.absolute(), seeds, args.budgets, args.factor, args.task, args.methods, overrides)
    return study, args.list, args.part


@exit_on_user_error
def main(argv: list[str]) -> None:
    study, list_only, part = parse_study(argv)
    jobs = study_jobs(study)
    check_every_config(jobs)
    if list_only:
        for job in jobs:
            print(f"{job.name}\t{job.stage}\tpython {' '.join(job.command())}")
        return
    for stage in PARTS[part]:
        stage_jobs = [job for job in jobs if job.stage == stage]
        plans = plan_stage(stage_jobs)
        print(f"study: {len(stage_jobs)} {stage} jobs planned", flush=True)
        study.directory.mkdir(parents=True, exist_ok=True)
        run_stage(stage_jobs, plans)
    compare(study)


if __name__ == "__main__":
    main(sys.argv[1:])
