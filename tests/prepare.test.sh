# prepare.test.sh — `ctune prepare` (token-id JSONL with HF / TRL mask fields ->
# shards) and `ctune inspect` on its output, driven through the binary.
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

prepare_completion_mask_and_assistant_masks_set_the_label_fraction() {
    cat >trl.jsonl <<'EOF2'
{"input_ids": [1, 2, 3, 4], "completion_mask": [0, 0, 1, 1]}
{"input_ids": [5, 6, 7, 8], "assistant_masks": [false, true, false, false]}
EOF2
    expect_exit 0 "$CTUNE" prepare --in trl.jsonl --out out || return 1
    has out.txt "2 docs, 8 tokens, 37.5% labels" || return 1
    expect_exit 0 "$CTUNE" inspect out/train.shard || return 1
    has out.txt "labels       3 (37.5%" || return 1
}

prepare_mask_fields_that_agree_are_accepted_and_ones_that_disagree_name_the_line() {
    printf '{"input_ids": [1, 2, 3], "labels": [-100, 2, 3], "completion_mask": [0, 1, 1]}\n' >agree.jsonl
    expect_exit 0 "$CTUNE" prepare --in agree.jsonl --out out || return 1
    has out.txt "66.7% labels" || return 1
    printf '{"input_ids": [1]}\n{"input_ids": [1, 2, 3], "labels": [-100, 2, 3], "assistant_masks": [0, 0, 1]}\n' >clash.jsonl
    expect_exit 2 "$CTUNE" prepare --in clash.jsonl --out out2 || return 1
    has err.txt "clash.jsonl:2: labels and assistant_masks disagree at token 1" || return 1
    [ ! -e out2 ] || { echo "a failed prepare created out2/"; return 1; }
}

prepare_mask_of_another_length_or_value_names_the_line() {
    printf '{"input_ids": [1, 2, 3], "completion_mask": [0, 1]}\n' >short.jsonl
    expect_exit 2 "$CTUNE" prepare --in short.jsonl --out out || return 1
    has err.txt "short.jsonl:1: completion_mask has 2 entries but input_ids has 3" || return 1
    printf '{"input_ids": [1, 2], "assistant_masks": [0, 2]}\n' >two.jsonl
    expect_exit 2 "$CTUNE" prepare --in two.jsonl --out out || return 1
    has err.txt "two.jsonl:1: assistant_masks[1] must be 0 or 1, found 2" || return 1
}

prepare_in_folder_and_out_file_are_one_line_input_errors() {
    write_small_jsonl
    mkdir folder
    expect_exit 2 "$CTUNE" prepare --in folder --out out || return 1
    has err.txt "folder: a folder, not a regular file" || return 1
    [ "$(wc -l <err.txt)" -eq 1 ] || { echo "expected one line:"; cat err.txt; return 1; }
    echo "not a folder" >file
    expect_exit 2 "$CTUNE" prepare --in data.jsonl --out file || return 1
    has err.txt "--out file: exists and is not a folder" || return 1
    [ "$(wc -l <err.txt)" -eq 1 ] || { echo "expected one line:"; cat err.txt; return 1; }
    has file "not a folder" || return 1
}

# peak_rss_kib CMD...: the maximum resident set size of CMD, in KiB.
peak_rss_kib() {
    /usr/bin/time -v "$@" >out.txt 2>time.txt || { cat time.txt; return 1; }
    awk '/Maximum resident set size/ { print $NF }' time.txt
}

# A 20 MB line of ids once took 19x its size in memory (a JSON tree of ~80 bytes
# an id), then the line plus two copies of its tokens (5x for single-digit ids:
# the writer's own copy, then an image of the file at save). Now the tokens go
# straight into the writer and are saved from there: the line plus 5 bytes a
# token (1.7x for ids of json.dumps, 3.5x for "1,2,3"), plus 8 MB.
prepare_memory_is_the_line_plus_5_bytes_a_token() {
    python3 -c '
import random
random.seed(1)
ids = ", ".join(str(random.randrange(151936)) for _ in range(2750000))
open("big.jsonl", "w").write("{\"input_ids\": [" + ids + "]}\n")
ids = ",".join(random.choice("0123456789") for _ in range(10000000))
open("dense.jsonl", "w").write("{\"input_ids\": [" + ids + "]}\n")' || return 1
    local size rss base f tokens
    # the binary's own footprint (a GPU build maps the CUDA libraries) is measured
    # on a small input and left out
    write_small_jsonl
    base=$(peak_rss_kib "$CTUNE" prepare --in data.jsonl --out small) || return 1
    for f in big:2750000 dense:10000000; do
        tokens=${f#*:} f=${f%:*}
        size=$(stat -c %s "$f.jsonl")
        rss=$(peak_rss_kib "$CTUNE" prepare --in "$f.jsonl" --out "$f") || return 1
        has out.txt "$tokens tokens" || return 1
        echo "$f: line $size bytes, $tokens tokens, max RSS $rss KiB, $base KiB on a small input"
        [ $(((rss - base) * 1024)) -le $((size + 5 * tokens + 8000000)) ] ||
            { echo "max RSS $rss KiB less $base KiB exceeds the line + 5 bytes a token + 8 MB"; return 1; }
    done
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
run_test prepare_completion_mask_and_assistant_masks_set_the_label_fraction
run_test prepare_mask_fields_that_agree_are_accepted_and_ones_that_disagree_name_the_line
run_test prepare_mask_of_another_length_or_value_names_the_line
run_test prepare_in_folder_and_out_file_are_one_line_input_errors
if [ -x /usr/bin/time ] && command -v python3 >/dev/null && [ -z "${CTUNE_SANITIZED:-}" ]; then
    run_test prepare_memory_is_the_line_plus_5_bytes_a_token
else
    skip_test prepare_memory_is_the_line_plus_5_bytes_a_token "needs /usr/bin/time and python3, no sanitizer"
fi
run_test inspect_corrupt_shard_names_the_file_and_exits_2
summary
