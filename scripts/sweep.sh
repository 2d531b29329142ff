#!/usr/bin/env bash
# sweep.sh — a grid of `ctune train` runs over --set values, one output_dir each,
# then `ctune summary` over them.
#
#   scripts/sweep.sh CONFIG.yaml OUT_ROOT KEY=V1,V2,... [KEY=V1,...]... [-- EXTRA ctune train ARGS]
#   scripts/sweep.sh configs/tiny.yaml runs/sweep lora.r=4,8 training.learning_rate=1e-3,2e-3
#
# Every combination runs in OUT_ROOT/NAME, NAME made of the last part of each key
# and its value (r-4_learning_rate-1e-3); its log goes to OUT_ROOT/NAME/train.log.
# Values are split at commas outside brackets, so lora.target_modules=[q_proj,v_proj],all-linear
# gives two values. A run that already has final/ is skipped, and the others resume
# from their newest checkpoint (resume_from_checkpoint: auto), so running the same
# sweep again finishes an interrupted one. Ctrl-C stops the sweep after the running
# ctune has saved its checkpoint. The table goes to stdout and OUT_ROOT/summary.csv.
# Exit status: 0 when every run finished, 1 when one failed, 130/143 when interrupted.
# ctune is $CTUNE, else build/ctune next to this script.
set -u

usage() { sed -n '4,5p' "$0" | sed 's/^# *//' >&2; exit 2; }
[ $# -ge 3 ] || usage
config=$1 root=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
ctune=${CTUNE:-$here/../build/ctune}
[ -x "$ctune" ] || { echo "sweep: $ctune not found (make, or set CTUNE)" >&2; exit 2; }
[ -f "$config" ] || { echo "sweep: $config: no such file" >&2; exit 2; }

keys=() lists=() extra=()
while [ $# -gt 0 ]; do
    if [ "$1" = "--" ]; then shift; extra=("$@"); break; fi
    case $1 in
        *=*) keys+=("${1%%=*}"); lists+=("${1#*=}") ;;
        *) echo "sweep: '$1' is not KEY=V1,V2,..." >&2; usage ;;
    esac
    shift
done
[ ${#keys[@]} -gt 0 ] || usage

# Splits $1 at commas outside [...] into the array `values`.
split_values() {
    values=()
    local s=$1 cur="" depth=0 i c
    for ((i = 0; i < ${#s}; i++)); do
        c=${s:i:1}
        case $c in
            "[") depth=$((depth + 1)); cur+=$c ;;
            "]") depth=$((depth - 1)); cur+=$c ;;
            ",") if [ $depth -eq 0 ]; then values+=("$cur"); cur=""; else cur+=$c; fi ;;
            *) cur+=$c ;;
        esac
    done
    values+=("$cur")
}

# The grid as lines of "idx idx ..." (mixed-radix counting over the value lists).
n_runs=1
declare -a counts
for i in "${!keys[@]}"; do
    split_values "${lists[$i]}"
    counts[$i]=${#values[@]}
    n_runs=$((n_runs * ${#values[@]}))
done

mkdir -p "$root" || exit 1
dirs=() failed=0
for ((run = 0; run < n_runs; run++)); do
    sets=() name="" rest=$run
    for i in "${!keys[@]}"; do
        split_values "${lists[$i]}"
        v=${values[$((rest % counts[i]))]}
        rest=$((rest / counts[i]))
        sets+=(--set "${keys[$i]}=$v")
        part="${keys[$i]##*.}-$(printf '%s' "$v" | tr -c 'A-Za-z0-9.+-' '_' | sed 's/__*/_/g; s/^_//; s/_$//')"
        name=${name:+${name}_}$part
    done
    dir=$root/$name
    dirs+=("$dir")
    if [ -f "$dir/final/adapter_config.json" ]; then
        echo "sweep: [$((run + 1))/$n_runs] $name: finished before, skipped"
        continue
    fi
    mkdir -p "$dir"
    echo "sweep: [$((run + 1))/$n_runs] $name: ctune train $config ${sets[*]} ${extra[*]:-}"
    start=$(date +%s)
    rc=0
    "$ctune" train "$config" "${sets[@]}" "${extra[@]}" --set "output_dir=$dir" 2>"$dir/train.log" || rc=$?
    if [ $rc -eq 130 ] || [ $rc -eq 143 ]; then
        echo "sweep: interrupted during $name (its checkpoint is saved; run the same sweep again to go on)" >&2
        exit $rc
    fi
    if [ $rc -ne 0 ]; then
        failed=$((failed + 1))
        echo "sweep: $name FAILED (exit $rc): $(tail -n 1 "$dir/train.log")" >&2
    else
        echo "sweep: $name done in $(( $(date +%s) - start )) s"
    fi
done
"$ctune" summary --out "$root/summary.csv" "${dirs[@]}"
[ $failed -eq 0 ] || { echo "sweep: $failed of $n_runs runs failed" >&2; exit 1; }
