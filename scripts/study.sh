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
# Schemes: every configs/pe/*.yaml (found at run time, so a new scheme is included without editing this). The
# options are declared, with their domains, by the planner scripts/study_check.py, which plans every job before the
# first one trains (as train.py --check does) and makes the study's folder only then: a scheme that train.py
# refuses with the study's settings (a per-layer pattern longer than model.n_layer) is skipped with one line, and
# the study goes on; a refusal of a later seed of a scheme whose first is accepted (a bad value in that job), or of
# every scheme, stops the study there (one line, exit 2), before anything trains.
# Resumable: each (scheme, seed) trains into <dir>/<scheme>-s<seed>/; a run with a checkpoint is resumed
# (train.resume=true: a finished and evaluated run has nothing to do, an interrupted one trains on or runs the
# evaluation it missed), and a run's evaluation with its scheme's variations is skipped once done. The
# comparison is rewritten at the end from every finished run in <dir>.
# Arguments after the directory are Hydra overrides for train.py; they override the study's settings below (not
# its schemes and seeds), and eval.py starts from the config each run stores.
# Environment: EVAL_VARIATIONS replaces the variations of every scheme that has some (its entry in
# scripts/study_variations.py; RoPE: [yarn:16,ntk:16,self_extend:32:32,rerope:32,string:32:4]), e.g.
# EVAL_VARIATIONS="[yarn:16]", checked as eval.py will check it before any run trains. A run evaluated before is evaluated only with the variations it lacks (eval/.variations-done lists those it has).
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

# The study's options, its folder and every job are planned first, in one process (scripts/study_check.py, which
# declares the options): a mistake in any of them is one line, exit 2, before the study's folder is made. Its plan is
# NUL-separated fields: the folder, the kind of study, whether it only lists, then each run's folder, task, scheme,
# the variations it is evaluated with, and its train.py arguments (a count, then those).
plan_file=$(mktemp)
trap 'rm -f "$plan_file"' EXIT
python scripts/study_check.py --plan-to "$plan_file" "$@"
mapfile -d '' -t plan < "$plan_file"
study_dir=${plan[0]} kind=${plan[1]} mode=${plan[2]}
[[ "$mode" == list ]] && exit 0  # study_check.py printed the runs it would make

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

declare -A refused
i=3
while [[ $i -lt ${#plan[@]} ]]; do
    run=${plan[i]} task=${plan[i+1]} scheme=${plan[i+2]} variations=${plan[i+3]} count=${plan[i+4]}
    train_args=("${plan[@]:i+5:count}")
    i=$((i + 5 + count))
    [[ -n "${refused[$task/$scheme]:-}" ]] && continue
    # A run with a checkpoint is resumed: train.py alone knows whether it is done (it says "nothing to do"), still
    # training, or trained but not (fully) evaluated, e.g. stopped between its perplexity and the probes of
    # eval.tasks (it then runs that evaluation).
    resume=()
    [[ -f "$run/checkpoints/last.pt" ]] && resume=(train.resume=true)
    status=0
    python train.py "${train_args[@]}" "hydra.run.dir=$run" "${resume[@]}" || status=$?
    if [[ $status -eq 2 && ! -f "$run/checkpoints/last.pt" ]]; then  # refused at start-up (the line above)
        echo "study: pe=$scheme is refused with these settings; its runs are skipped" >&2
        refused[$task/$scheme]=1
        continue
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

shopt -s nullglob
if [[ "$kind" == tasks ]]; then  # every finished task run in <dir> (a language-model run has extrapolation.json)
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
