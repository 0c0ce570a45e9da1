#!/usr/bin/env bash
# The length-extrapolation study: train every positional scheme with identical settings over several seeds,
# evaluate each at 1-16x its training length (both protocols, at the end of training), evaluate each run again
# with the evaluation-time variations its scheme declares (RoPE: YaRN, NTK, Self-Extend, ReRoPE), and compare
# them all: mean ± 95% CI over seeds.
#
#   scripts/study.sh                                   # -> multirun/study-<date>/, 3 seeds of every scheme
#   scripts/study.sh runs/study                        # into runs/study/ (run it again to finish what is missing)
#   scripts/study.sh --seeds 5 runs/study              # seeds 1..5
#   scripts/study.sh --seed-list 4,5 --schemes rope,alibi runs/study   # a part: these seeds of these schemes
#   scripts/study.sh --list runs/study                 # print the runs it would make, make none
#   scripts/study.sh /tmp/smoke train.max_steps=20 eval.max_tokens=2048    # a quick smoke test
#   scripts/study.sh --tasks passkey,mqar runs/tasks  # the task study: every scheme x seed trained on each task
#
# Schemes: every configs/pe/*.yaml (found at run time, so a new scheme is included without editing this). Every
# job is planned before the first one trains (train.py --check): a scheme that train.py refuses with the study's
# settings (a per-layer pattern longer than model.n_layer) is skipped with one line, and the study goes on; a
# refusal of a later seed of a scheme whose first is accepted (a bad value in that job), or of every scheme, stops
# the study there (one line, exit 2), before anything trains.
# Resumable: each (scheme, seed) trains into <dir>/<scheme>-s<seed>/; a run with a checkpoint is resumed
# (train.resume=true: a finished and evaluated run has nothing to do, an interrupted one trains on or runs the
# evaluation it missed), and a run's evaluation with its scheme's variations is skipped once done. The
# comparison is rewritten at the end from every finished run in <dir>.
# Arguments after the directory are Hydra overrides for train.py; they override the study's settings below,
# and eval.py reuses them (it recomposes each run's config from its training overrides).
# Environment: EVAL_VARIATIONS replaces the variations of every scheme that has some (its entry in
# scripts/study_variations.py; RoPE: [yarn:16,ntk:16,self_extend:32:32,rerope:32,string:32:4]), e.g.
# EVAL_VARIATIONS="[yarn:16]". A run evaluated before is evaluated only with the variations it lacks (eval/.variations-done lists those it has).
#
# Task study (--tasks): each (task, scheme, seed) trains with task=<task>, so with the task's own model, steps and
# learning rate (configs/task/<task>.yaml), into <dir>/<task>-<scheme>-s<seed>/; its evaluation is
# eval/tasks.json (accuracy at 0.5x .. 16x, the task's grid), and it is evaluated with its scheme's variations as above. The same
# skipping and resuming apply; the comparison is comparison_tasks.md (a table per task, mean ± CI over seeds),
# comparison_tasks.csv and comparison_tasks.png (accuracy vs length, a panel per task).
#
# Settings: train.py's defaults, evaluated on the same validation tokens at 1x .. 16x the training length, except
# the language-model study's batch, twice the quick default's: 8 sequences a step (614K training tokens), as
# the committed studies (results/) were trained.
# Output, in the study directory:
#   <scheme>-s<seed>/              each training run (checkpoints, metrics.jsonl, eval/ with its own reports)
#   comparison.md, comparison.png  nonoverlapping protocol: perplexity by length (mean ± CI over seeds, bands),
#                                  the differences that exceed their intervals, and ppl@kL / ppl@L
#   comparison_sliding.md, comparison_sliding.png                       the same for the sliding protocol
#   comparison_per_position.png    loss by position within the longest windows, one line (and band) per setting
#   comparison_val_loss.png        validation loss during training, per setting (its table is in comparison.md)
set -euo pipefail
cd "$(dirname "$0")/.."

seeds=3
seeds_given=""
seed_list=""
schemes=""
tasks=""
list_only=false
usage="use --seeds N, --seed-list A,B, --schemes a,b, --tasks a,b, --list"
# An option that takes a value and is given none (the last argument, or followed by another option): one line.
value_of() {
    if [[ $# -lt 2 || -z "$2" || "$2" == --* ]]; then
        echo "error: $1 takes a value ($usage)" >&2
        exit 2
    fi
}
while [[ $# -gt 0 && "$1" == --* ]]; do
    case "$1" in
        --seeds) value_of "$@"; seeds="$2"; seeds_given=true; shift 2 ;;
        --seed-list) value_of "$@"; seed_list="$2"; shift 2 ;;
        --schemes) value_of "$@"; schemes="$2"; shift 2 ;;
        --tasks) value_of "$@"; tasks="$2"; shift 2 ;;
        --list) list_only=true; shift ;;
        *) echo "error: unknown option $1 ($usage)" >&2
           exit 2 ;;
    esac
done
study_dir="multirun/study-$(date +%Y-%m-%d_%H-%M-%S)"
# The first argument is the study's folder unless it reads as a Hydra override (key=value, the value holding any
# character, a slash too); an existing folder is a folder whatever its name holds, and a new one whose name holds
# "=" is named so that no key reads in it (./a=b, or its absolute path).
override_pattern='^[+~]{0,2}[A-Za-z_][A-Za-z0-9_.@]*(/[A-Za-z0-9_.@]+)*='
if [[ $# -gt 0 && ( -d "$1" || ! "$1" =~ $override_pattern ) ]]; then
    study_dir="$1"
    shift
fi
# The folder is made only once every job is planned (below); a path through a file is refused now, at no cost.
existing="$study_dir"
while [[ ! -e "$existing" && "$existing" != "$(dirname "$existing")" ]]; do existing=$(dirname "$existing"); done
if [[ ! -d "$existing" ]]; then
    echo "error: cannot make the study directory $study_dir: Not a directory" >&2
    exit 2
fi

if [[ -z "$schemes" ]]; then  # every scheme with a config
    schemes=$(find configs/pe -maxdepth 1 -name '*.yaml' -exec basename {} .yaml \; | sort | paste -sd, -)
fi
if [[ -n "$seed_list" && -n "$seeds_given" ]]; then  # one of them would be read, the other ignored
    echo "error: --seeds is not read when --seed-list gives the seeds: drop one of them" >&2
    exit 2
fi
if [[ -z "$seed_list" ]]; then
    if [[ ! "$seeds" =~ ^[1-9][0-9]*$ ]]; then
        echo "error: --seeds takes a positive count (3), got '$seeds'; --seed-list takes seeds (4,5)" >&2
        exit 2
    fi
    seed_list=$(seq -s, 1 "$seeds")
elif [[ ! "$seed_list" =~ ^[0-9]+(,[0-9]+)*$ ]]; then
    echo "error: --seed-list takes comma-separated seeds (4,5), got '$seed_list'" >&2
    exit 2
fi
IFS=, read -ra scheme_list <<< "$schemes"
IFS=, read -ra seeds <<< "$seed_list"
for scheme in "${scheme_list[@]}"; do  # here, so that --list never lists runs of a scheme that does not exist
    if [[ ! "$scheme" =~ ^[A-Za-z0-9_]+$ || ! -f "configs/pe/$scheme.yaml" ]]; then
        known=$(find configs/pe -maxdepth 1 -name '*.yaml' -exec basename {} .yaml \; | sort | paste -sd, -)
        echo "error: --schemes takes schemes of configs/pe/ ($known), got '$scheme'" >&2
        exit 2
    fi
done
# The task study trains on each task; the language-model study on task "none" (train.py's default).
task_list=(none)
if [[ -n "$tasks" ]]; then
    IFS=, read -ra task_list <<< "$tasks"
    for task in "${task_list[@]}"; do
        if [[ "$task" == none || ! -f "configs/task/$task.yaml" ]]; then
            known=$(find configs/task -maxdepth 1 -name '*.yaml' ! -name none.yaml -exec basename {} .yaml \; | sort)
            echo "error: --tasks takes tasks of configs/task/ ($(paste -sd, <<< "$known")), got '$task'" >&2
            exit 2
        fi
    done
fi

# <dir>/<scheme>-s<seed>, and <dir>/<task>-<scheme>-s<seed> in the task study
run_dir() {
    if [[ "$1" == none ]]; then echo "$study_dir/$2-s$3"; else echo "$study_dir/$1-$2-s$3"; fi
}


# "<scheme> <eval.variations list>" a line per scheme given: the variations a study evaluates the scheme's runs
# with (the list "" when the scheme declares none). One process for all: each imports torch.
study_variations() {
    python scripts/study_variations.py "$@"
}

# "[a,b]" -> its entries, one a line
list_entries() {
    [[ -n "$1" ]] && tr -d '[] ' <<< "$1" | tr ',' '\n' | grep -v '^$' || true
}
# The entries of the list $1 that are not in the list $2, comma-separated ("" when none).
missing_variations() {
    local entry missing=()
    while read -r entry; do
        [[ -n "$entry" ]] && ! list_entries "$2" | grep -qxF -- "$entry" && missing+=("$entry")
    done < <(list_entries "$1")
    (IFS=,; echo "${missing[*]}")
}

declare -A variations_of
declared=$(study_variations "${scheme_list[@]}")
while read -r scheme variations; do
    [[ -n "$variations" && -n "${EVAL_VARIATIONS:-}" ]] && variations="$EVAL_VARIATIONS"
    variations_of[$scheme]=$variations
done <<< "$declared"

# A task run scores its own grid (configs/task/: 0.5x and 0.75x too); the language-model study 1x .. 16x.
set_task_args() {
    task_args=("eval.length_multipliers=[1,2,4,8,16]" "train.batch_size=8")
    [[ "$1" != none ]] && task_args=("task=$1")
    return 0
}
# Every job's plan, before the first one trains. The first seed of a scheme refused: the scheme is refused with
# these settings (skipped). A later seed refused (train.py names its job, 1 or more): a bad value, refused here.
# One process plans every scheme of a task (scripts/study_check.py), each as train.py --check plans its seeds.
# The study names its W&B group after its folder, where W&B runs (disabled, nothing reads a group).
# Quoted for Hydra, so that a folder name holding a comma, a bracket or a quote stays one value.
group_name=$(basename "$study_dir" | sed -e "s/'/\\\\'/g")  # a backslash is an escape only before a quote
group=("logging.wandb.group='$group_name'")
for arg in "$@"; do
    if [[ "$arg" == "logging.wandb.mode=disabled" ]]; then group=(); fi
done
declare -A refused
accepted=0
for task in "${task_list[@]}"; do
    set_task_args "$task"
    status=0
    verdicts=$(python scripts/study_check.py "$seed_list" "${scheme_list[@]}" -- "${task_args[@]}" "${group[@]}" "$@") \
        || status=$?
    [[ $status -ne 0 ]] && exit "$status"  # its one line said why: a later seed refused, or the command's mistake
    while read -r scheme verdict reason; do
        if [[ "$verdict" == refused ]]; then
            echo "study: pe=$scheme is refused with these settings; its runs are skipped (${reason#error: })" >&2
            refused[$task/$scheme]=1
        else
            accepted=$((accepted + 1))
        fi
    done <<< "$verdicts"
done
if [[ $accepted -eq 0 ]]; then
    echo "error: every scheme is refused with these settings (the lines above say why); nothing was trained" >&2
    exit 2
fi

if $list_only; then  # the runs it would make: every job planned above, the refused schemes left out
    for task in "${task_list[@]}"; do for scheme in "${scheme_list[@]}"; do
        [[ -n "${refused[$task/$scheme]:-}" ]] && continue
        for seed in "${seeds[@]}"; do run_dir "$task" "$scheme" "$seed"; done
    done; done
    exit 0
fi

# Every job is planned: only now is the study's folder made. A path through a file is a mistake in the command
# (2); a missing permission or a full disk, the machine's (74).
if ! mkdir_error=$(mkdir -p "$study_dir" 2>&1); then
    case "$mkdir_error" in
        *"Not a directory"* | *"File exists"* | *"File name too long"* | *"Too many levels"*) code=2 ;;
        *) code=74 ;;
    esac
    echo "error: cannot make the study directory $study_dir: ${mkdir_error##*: }" >&2
    exit "$code"
fi

for task in "${task_list[@]}"; do
    set_task_args "$task"
    for scheme in "${scheme_list[@]}"; do
        [[ -n "${refused[$task/$scheme]:-}" ]] && continue
        variations=${variations_of[$scheme]}
        for seed in "${seeds[@]}"; do
            run=$(run_dir "$task" "$scheme" "$seed")
            # A run with a checkpoint is resumed: train.py alone knows whether it is done (it says "nothing to
            # do"), still training, or trained but not (fully) evaluated, e.g. stopped between its perplexity and
            # the probes of eval.tasks (it then runs that evaluation).
            resume=()
            [[ -f "$run/checkpoints/last.pt" ]] && resume=(train.resume=true)
            status=0
            python train.py "${task_args[@]}" "pe=$scheme" "train.seed=$seed" "hydra.run.dir=$run" \
                "${group[@]}" \
                "${resume[@]}" "$@" || status=$?
            if [[ $status -eq 2 && ! -f "$run/checkpoints/last.pt" ]]; then  # refused at start-up (the line above)
                echo "study: pe=$scheme is refused with these settings; its runs are skipped" >&2
                continue 2
            fi
            [[ $status -eq 0 ]] || exit "$status"
            # (.scalings-done: the marker of studies run before eval.scalings became eval.variations)
            done_before=$(cat "$run/eval/.variations-done" 2>/dev/null || cat "$run/eval/.scalings-done" 2>/dev/null || true)
            missing=$(missing_variations "$variations" "$done_before")
            if [[ -n "$missing" ]]; then  # only those not yet evaluated (a scheme may declare more later)
                python eval.py "run_dir=$run" "eval.variations=[$missing]"
                echo "[$({ list_entries "$done_before"; tr ',' '\n' <<< "$missing"; } | paste -sd, -)]" \
                    > "$run/eval/.variations-done"
            fi
        done
    done
done

shopt -s nullglob
if [[ -n "$tasks" ]]; then  # every finished task run in <dir> (a language-model run has extrapolation.json)
    runs=()
    for run in "$study_dir"/*/; do
        [[ -f "$run/eval/tasks.json" && ! -f "$run/eval/extrapolation.json" ]] && runs+=("$run")
    done
    python scripts/compare.py "${runs[@]}" --markdown "$study_dir/comparison_tasks.md" \
        --task-plot "$study_dir/comparison_tasks.png" --task-heatmap "$study_dir/comparison_tasks_heatmap.png" \
        --task-csv "$study_dir/comparison_tasks.csv"
    exit 0
fi
runs=()
for run in "$study_dir"/*/; do
    [[ -f "$run/eval/extrapolation.json" ]] && runs+=("$run")
done
python scripts/compare.py "${runs[@]}" --ratios --markdown "$study_dir/comparison.md" \
    --plot "$study_dir/comparison.png" --per-position "$study_dir/comparison_per_position.png" \
    --val-curve "$study_dir/comparison_val_loss.png"
if grep -qE '"protocol" *: *"sliding"' "${runs[0]}eval/extrapolation.json"; then  # eval.protocols may leave it out
    python scripts/compare.py "${runs[@]}" --ratios --protocol sliding \
        --markdown "$study_dir/comparison_sliding.md" --plot "$study_dir/comparison_sliding.png"
fi
