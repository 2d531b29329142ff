# prepare.test.sh — `ctune prepare` (token-id JSONL -> shards) and `ctune inspect`
# on its output, driven through the binary.
# Every check ends in `|| return 1`: run_test calls each test inside an `if`,
# where bash ignores `set -e`, so a failed command would not stop the test.
source "$(dirname "$0")/lib.sh"

# has FILE TEXT: FILE contains TEXT (fixed string), else prints both and fails.
has() {
    grep -qF -- "$2" "$1" && return 0
    echo "expected '$2' in $1:"; cat "$1"; return 1
}

# Three documents: HF labels (2 of 4 tokens are labels), a loss_mask (1 of 2),
# and neither (all 3 tokens are labels): 9 tokens, 6 labels.
write_small_jsonl() {
    cat >data.jsonl <<'EOF'
{"input_ids": [10, 11, 12, 13], "labels": [-100, -100, 12, 13]}

{"input_ids": [20, 21], "loss_mask": [0, 1], "text": "ignored"}
{"input_ids": [30, 31, 32]}
EOF
}

# ten documents of length 1..10
write_ten_docs() {
    : >ten.jsonl
    for n in 1 2 3 4 5 6 7 8 9 10; do
        printf '{"input_ids": [%s]}\n' "$(seq -s, 1 "$n")" >>ten.jsonl
    done
}

prepare_with_labels_and_loss_mask_then_inspect_shows_counts() {
    write_small_jsonl
    expect_exit 0 "$CTUNE" prepare --in data.jsonl --out out --vocab-size 100 || return 1
    has out.txt "3 docs, 9 tokens, 66.7% labels" || return 1
    [ -f out/train.shard ] || { echo "no out/train.shard"; return 1; }
    [ ! -e out/eval.shard ] || { echo "eval.shard written without --eval-fraction"; return 1; }
    expect_exit 0 "$CTUNE" inspect out/train.shard || return 1
    has out.txt "CRC ok" || return 1
    has out.txt "documents    3" || return 1
    has out.txt "tokens       9" || return 1
    has out.txt "labels       6 (66.7%" || return 1
    has out.txt "min 2, mean 3.0, max 4" || return 1
    has out.txt "max token id 32" || return 1
}

prepare_bad_line_reports_line_number_and_exits_2() {
    write_small_jsonl
    echo '{"input_ids": [1, 2, 3], "labels": [1, 2]}' >>data.jsonl
    expect_exit 2 "$CTUNE" prepare --in data.jsonl --out out || return 1
    has err.txt "data.jsonl:5: labels has 2 entries but input_ids has 3" || return 1
    [ ! -e out ] || { echo "a failed prepare created out/"; return 1; }
}

prepare_malformed_json_and_bad_ids_name_the_line() {
    printf '{"input_ids": [1, 2}\n' >a.jsonl
    expect_exit 2 "$CTUNE" prepare --in a.jsonl --out out || return 1
    has err.txt "a.jsonl:1:" || return 1
    printf '{"input_ids": [1]}\n{"input_ids": []}\n' >b.jsonl
    expect_exit 2 "$CTUNE" prepare --in b.jsonl --out out || return 1
    has err.txt "b.jsonl:2: input_ids is empty" || return 1
    printf '{"input_ids": [1, 2.5]}\n' >c.jsonl
    expect_exit 2 "$CTUNE" prepare --in c.jsonl --out out || return 1
    has err.txt "c.jsonl:1: input_ids[1]" || return 1
    printf '{"input_ids": [1, 2], "labels": [-100, 7]}\n' >d.jsonl
    expect_exit 2 "$CTUNE" prepare --in d.jsonl --out out || return 1
    has err.txt "d.jsonl:1: labels[1]" || return 1
}

prepare_token_over_vocab_size_is_error() {
    write_small_jsonl
    expect_exit 2 "$CTUNE" prepare --in data.jsonl --out out --vocab-size 32 || return 1
    has err.txt "data.jsonl:4: input_ids[2] = 32 >= vocab size 32" || return 1
}

prepare_eval_fraction_splits_documents() {
    write_ten_docs
    expect_exit 0 "$CTUNE" prepare --in ten.jsonl --out out --eval-fraction 0.2 --seed 7 || return 1
    has out.txt "out/train.shard (8 docs" || return 1
    has out.txt "out/eval.shard (2 docs" || return 1
    expect_exit 0 "$CTUNE" inspect out/train.shard out/eval.shard || return 1
    has out.txt "total (2 shards):" || return 1
    has out.txt "documents    10" || return 1
    has out.txt "tokens       55" || return 1
    # the split is a function of the seed: the same seed gives the same bytes
    expect_exit 0 "$CTUNE" prepare --in ten.jsonl --out again --eval-fraction 0.2 --seed 7 || return 1
    cmp out/eval.shard again/eval.shard || return 1
    cmp out/train.shard again/train.shard || return 1
}

prepare_small_eval_fraction_keeps_one_eval_doc() {
    write_ten_docs
    expect_exit 0 "$CTUNE" prepare --in ten.jsonl --out out --eval-fraction 0.01 || return 1
    has out.txt "out/eval.shard (1 docs" || return 1
}

prepare_unknown_flag_exits_2() {
    write_small_jsonl
    expect_exit 2 "$CTUNE" prepare --in data.jsonl --out out --shuffle || return 1
    has err.txt "--shuffle" || return 1
    expect_exit 2 "$CTUNE" prepare --out out || return 1
    has err.txt "usage:" || return 1
    expect_exit 2 "$CTUNE" prepare --in data.jsonl --out out --eval-fraction 1.5 || return 1
    has err.txt "--eval-fraction" || return 1
}

inspect_corrupt_shard_names_the_file_and_exits_2() {
    write_small_jsonl
    expect_exit 0 "$CTUNE" prepare --in data.jsonl --out out || return 1
    # byte 100 lies in the token array (after the 64-byte header and 4 offsets)
    printf '\377' | dd of=out/train.shard bs=1 seek=100 conv=notrunc 2>/dev/null || return 1
    expect_exit 2 "$CTUNE" inspect out/train.shard || return 1
    has err.txt "out/train.shard: CRC mismatch" || return 1
}

run_test prepare_with_labels_and_loss_mask_then_inspect_shows_counts
run_test prepare_bad_line_reports_line_number_and_exits_2
run_test prepare_malformed_json_and_bad_ids_name_the_line
run_test prepare_token_over_vocab_size_is_error
run_test prepare_eval_fraction_splits_documents
run_test prepare_small_eval_fraction_keeps_one_eval_doc
run_test prepare_unknown_flag_exits_2
run_test inspect_corrupt_shard_names_the_file_and_exits_2
summary
