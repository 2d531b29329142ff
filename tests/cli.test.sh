# cli.test.sh — the conventions every subcommand shares (cli.h): --help and -h,
# unknown options, missing values, --opt=value, --version; and input files that
# are not regular files (a FIFO would block the reader) refused as input errors.
# Runs in seconds: no training.
source "$(dirname "$0")/lib.sh"

COMMANDS="train eval prepare init inspect merge generate summary"

# has FILE TEXT: FILE contains TEXT (fixed string), else prints both and fails.
has() {
    grep -qF -- "$2" "$1" && return 0
    echo "expected '$2' in $1:"; cat "$1"; return 1
}

every_command_prints_its_options_on_help_and_exits_0() {
    for cmd in $COMMANDS; do
        for h in --help -h; do
            expect_exit 0 "$CTUNE" "$cmd" $h || return 1
            has out.txt "usage: ctune $cmd" || return 1
            has out.txt "-h, --help" || return 1
            [ ! -s err.txt ] || { echo "$cmd $h wrote to stderr:"; cat err.txt; return 1; }
        done
    done
    "$CTUNE" eval --help >eval.txt && has eval.txt "--adapter DIR" && has eval.txt "--data SHARD..." || return 1
    "$CTUNE" merge --help >merge.txt && has merge.txt "--out DIR" || return 1
    # every option line carries a description after its name
    "$CTUNE" prepare --help >prepare.txt || return 1
    for opt in --in --out --vocab-size --eval-fraction --seed; do
        grep -qE -- "^  $opt [^ ]+ +[a-z]" prepare.txt || { echo "no description for $opt:"; cat prepare.txt; return 1; }
    done
}

help_wins_wherever_it_stands() {
    expect_exit 0 "$CTUNE" eval --model m --help || return 1
    has out.txt "usage: ctune eval" || return 1
    expect_exit 0 "$CTUNE" inspect some.shard --help || return 1
    has out.txt "usage: ctune inspect" || return 1
}

unknown_option_is_a_one_line_usage_error() {
    for cmd in $COMMANDS; do
        expect_exit 2 "$CTUNE" "$cmd" --bogus || return 1
        has err.txt "usage: unknown option '--bogus' (see ctune $cmd --help)" || return 1
        [ "$(wc -l <err.txt)" -eq 1 ] || { echo "$cmd: expected one line:"; cat err.txt; return 1; }
    done
}

missing_value_is_a_usage_error_naming_the_option() {
    expect_exit 2 "$CTUNE" prepare --in || return 1
    has err.txt "--in needs a value" || return 1
    expect_exit 2 "$CTUNE" generate --model || return 1
    has err.txt "--model needs a value" || return 1
    expect_exit 2 "$CTUNE" eval "$ROOT/configs/tiny.yaml" --adapter || return 1
    has err.txt "--adapter needs a value" || return 1
    expect_exit 2 "$CTUNE" train "$ROOT/configs/tiny.yaml" --set || return 1
    has err.txt "--set needs a value" || return 1
    expect_exit 2 "$CTUNE" merge --model a --adapter b || return 1
    has err.txt "usage: --out is required" || return 1
}

equals_form_is_the_same_as_a_separate_value() {
    printf '{"input_ids": [1, 2, 3]}\n{"input_ids": [4, 5]}\n' >d.jsonl
    expect_exit 0 "$CTUNE" prepare --in=d.jsonl --out=out --vocab-size=10 || return 1
    has out.txt "out/train.shard (2 docs, 5 tokens" || return 1
    expect_exit 2 "$CTUNE" prepare --in=d.jsonl --out=out2 --vocab-size=5 || return 1
    has err.txt "d.jsonl:2: input_ids[1] = 5 >= vocab size 5" || return 1
    expect_exit 2 "$CTUNE" train "$ROOT/configs/tiny.yaml" --dry-run=yes || return 1
    has err.txt "--dry-run takes no value" || return 1
}

set_is_repeatable_and_applies_after_the_config_wherever_it_stands() {
    expect_exit 0 "$CTUNE" train --set lora.r=8 "$ROOT/configs/tiny.yaml" --set=training.learning_rate=0.001 \
        --set lora.r=4 --print-config || return 1
    has out.txt "  r: 4" || return 1
    has out.txt "  learning_rate: 0.001" || return 1
    expect_exit 0 "$CTUNE" eval --set lora.r=8 "$ROOT/configs/tiny.yaml" --print-config || return 1
    has out.txt "  r: 8" || return 1
}

version_prints_the_version() {
    local want
    want=$(sed -n 's/^#define CT_VERSION "\(.*\)"$/\1/p' "$ROOT/src/cli/cli.h")
    [ -n "$want" ] || { echo "no CT_VERSION in src/cli/cli.h"; return 1; }
    expect_exit 0 "$CTUNE" --version || return 1
    [ "$(cat out.txt)" = "ctune $want" ] || { echo "got: $(cat out.txt)"; return 1; }
    expect_exit 0 "$CTUNE" version || return 1
    [ "$(cat out.txt)" = "ctune $want" ] || { echo "got: $(cat out.txt)"; return 1; }
}

# Each reader given a FIFO must refuse it at once (exit 2, naming the file);
# `timeout 10` turns a regression (a reader blocked on open) into a failure.
fifo_inputs_are_refused_instead_of_blocking() {
    mkfifo pipe
    mkdir run && mkfifo run/metrics.jsonl
    mkdir model && mkfifo model/config.json
    expect_exit 2 timeout 10 "$CTUNE" inspect pipe || return 1
    has err.txt "pipe: a FIFO, not a regular file" || return 1
    expect_exit 2 timeout 10 "$CTUNE" prepare --in pipe --out out || return 1
    has err.txt "pipe: a FIFO, not a regular file" || return 1
    expect_exit 2 timeout 10 "$CTUNE" init --config pipe --out m || return 1
    has err.txt "pipe: a FIFO, not a regular file" || return 1
    expect_exit 2 timeout 10 "$CTUNE" train pipe || return 1
    has err.txt "pipe: a FIFO, not a regular file" || return 1
    expect_exit 2 timeout 10 "$CTUNE" generate --model model --prompt-file pipe || return 1
    has err.txt "pipe: a FIFO, not a regular file" || return 1
    expect_exit 2 timeout 10 "$CTUNE" inspect model || return 1
    has err.txt "model/config.json: a FIFO, not a regular file" || return 1
    expect_exit 2 timeout 10 "$CTUNE" summary run || return 1
    has err.txt "run/metrics.jsonl: a FIFO, not a regular file" || return 1
}

run_test every_command_prints_its_options_on_help_and_exits_0
run_test help_wins_wherever_it_stands
run_test unknown_option_is_a_one_line_usage_error
run_test missing_value_is_a_usage_error_naming_the_option
run_test equals_form_is_the_same_as_a_separate_value
run_test set_is_repeatable_and_applies_after_the_config_wherever_it_stands
run_test version_prints_the_version
if command -v mkfifo >/dev/null && command -v timeout >/dev/null; then
    run_test fifo_inputs_are_refused_instead_of_blocking
else
    skip_test fifo_inputs_are_refused_instead_of_blocking "needs mkfifo and timeout"
fi
summary
