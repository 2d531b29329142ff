# prepare_text.test.sh — `ctune prepare --tokenizer` from text, through the
# binary: the options, the summary, the same shards for any --threads, JSON
# arrays, and every malformed input a one-line error naming FILE:LINE and the
# field, exit 2; then `ctune generate --prompt` with a model folder's
# tokenizer.json. The ids and masks themselves are held to Hugging Face's in
# tests/test_prepare_text.c (tests/fixtures/prepare_text).
source "$(dirname "$0")/lib.sh"

FIX=$ROOT/tests/fixtures/prepare_text
QWEN=$FIX/models/qwen

has() {
    grep -qF -- "$2" "$1" && return 0
    echo "expected '$2' in $1:"; cat "$1"; return 1
}

# expect_error TEXT ARGS...: prepare ARGS exits 2 with one line holding TEXT, and writes nothing.
expect_error() {
    local want=$1; shift
    expect_exit 2 "$CTUNE" prepare "$@" --out out || return 1
    has err.txt "$want" || return 1
    [ "$(wc -l <err.txt)" -eq 1 ] || { echo "expected one line:"; cat err.txt; return 1; }
    [ ! -e out ] || { echo "a failed prepare created out/"; return 1; }
}

prepare_help_names_every_option() {
    expect_exit 0 "$CTUNE" prepare --help || return 1
    for o in --in --out --tokenizer --format --chat-template --field-messages --field-role --field-content \
             --field-text --field-prompt --field-completion --train-on-inputs --max-length --threads \
             --vocab-size --eval-fraction --seed; do
        has out.txt "  $o" || return 1
    done
}

prepare_text_prints_a_summary_and_writes_the_shard() {
    expect_exit 0 "$CTUNE" prepare --tokenizer "$QWEN" --in "$FIX/messages.jsonl" --out out --threads 2 || return 1
    has out.txt "prepare: 4 messages records, 281 tokens, 27.4% labels" || return 1
    has out.txt "tokens/s, 2 threads" || return 1
    has out.txt "out/train.shard (4 docs, 281 tokens, 27.4% labels)" || return 1
    expect_exit 0 "$CTUNE" inspect out/train.shard || return 1
    has out.txt "CRC ok" || return 1
}

prepare_max_length_counts_truncated_and_skipped_records() {
    expect_exit 0 "$CTUNE" prepare --tokenizer "$FIX/models/llama3" --in "$FIX/messages.jsonl" --out out \
        --max-length 32 || return 1
    has out.txt "4 truncated to 32 tokens, 2 skipped (no label left)" || return 1
    has out.txt "(2 docs, 64 tokens" || return 1
}

prepare_shards_are_the_same_for_any_thread_count() {
    # 1200 chats, each a little different: several batches of records
    for i in $(seq 300); do sed 's/"content": "/&'"$i"' /g' "$FIX/messages.jsonl"; done >many.jsonl
    for t in 1 2 3; do
        expect_exit 0 "$CTUNE" prepare --tokenizer "$QWEN" --in many.jsonl --out "t$t" --threads "$t" \
            --format auto --field-messages messages --eval-fraction 0.05 --seed 3 || return 1
    done
    cmp t1/train.shard t2/train.shard && cmp t1/train.shard t3/train.shard || return 1
    cmp t1/eval.shard t2/eval.shard && cmp t1/eval.shard t3/eval.shard || return 1
}

prepare_reads_a_json_array_like_jsonl() {
    { echo '['; sed '$!s/$/,/' "$FIX/text.jsonl"; echo ']'; } >text.json
    expect_exit 0 "$CTUNE" prepare --tokenizer "$QWEN" --in "$FIX/text.jsonl" --out a || return 1
    expect_exit 0 "$CTUNE" prepare --tokenizer "$QWEN" --in text.json --out b || return 1
    cmp a/train.shard b/train.shard || return 1
}

prepare_token_ids_still_need_no_tokenizer() {
    printf '{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}\n' >ids.jsonl
    expect_exit 0 "$CTUNE" prepare --in ids.jsonl --out ok || return 1
    has out.txt "1 docs, 3 tokens, 66.7% labels" || return 1
    expect_error "apply to text" --in ids.jsonl --train-on-inputs || return 1
    { echo '['; cat ids.jsonl; echo ']'; } >ids.json
    expect_error "a JSON array of token-id records" --in ids.json || return 1
}

prepare_usage_errors_are_named() {
    expect_error "--format 'xml': expected auto, messages, sharegpt" --tokenizer "$QWEN" --in "$FIX/text.jsonl" \
        --format xml || return 1
    expect_error "messages.jsonl:1: a messages record: text needs --tokenizer MODEL_DIR" --in "$FIX/messages.jsonl" || return 1
    expect_error "--threads must be at least 1" --tokenizer "$QWEN" --in "$FIX/text.jsonl" --threads 0 || return 1
    expect_error "--max-length must be at least 2" --tokenizer "$QWEN" --in "$FIX/text.jsonl" --max-length 1 || return 1
    expect_error "--chat-template nosuch: not a built-in" --tokenizer "$QWEN" --in "$FIX/messages.jsonl" \
        --chat-template nosuch || return 1
}

prepare_tokenizer_problems_are_named() {
    mkdir empty
    expect_error "empty/tokenizer.json: cannot open" --tokenizer empty --in "$FIX/text.jsonl" || return 1
    mkdir wp
    sed 's/"type": *"BPE"/"type": "WordPiece"/' "$QWEN/tokenizer.json" >wp/tokenizer.json
    expect_error "model.type 'WordPiece' is not supported" --tokenizer wp --in "$FIX/text.jsonl" || return 1
    mkdir notemplate
    cp "$QWEN/tokenizer.json" notemplate/
    expect_error "notemplate" --tokenizer notemplate --in "$FIX/messages.jsonl" || return 1
}

# Each bad record, as line 2 after a good one: the error names data.jsonl:2 and the field.
prepare_malformed_records_name_the_line_and_the_field() {
    local good='{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}'
    bad() {
        printf '%s\n%s\n' "$good" "$1" >data.jsonl
        expect_error "data.jsonl:2: $2" --tokenizer "$QWEN" --in data.jsonl $3 || return 1
    }
    bad '{"messages": [{"role": "user", "content": "hi"}' "offset" || return 1
    bad '["not", "an object"]' "expected a JSON object, found an array" || return 1
    bad '{"messages": [{"role": "user", "content": null}]}' "messages[0].content: expected a string, found null" || return 1
    bad '{"messages": [{"content": "hi"}]}' "messages[0].role is missing" || return 1
    bad '{"messages": "hi"}' "messages: expected a list of messages, found a string" || return 1
    bad '{"messages": [{"role": "user", "content": "hi"}]}' "no assistant message" || return 1
    bad '{"messages": [{"role": "assistant", "content": "hi"}]}' "the conversation starts with an assistant message" || return 1
    bad '{"text": "a document"}' 'no "messages" key (found "text"): not a messages record like line 1' || return 1
    bad '{"foo": 1}' 'no "messages" key' || return 1
    # alone, with the format given
    alone() {
        printf '%s\n' "$1" >data.jsonl
        expect_error "data.jsonl:1: $2" --tokenizer "$QWEN" --in data.jsonl --format "$3" || return 1
    }
    alone '{"text": ""}' 'text: the text is empty' text || return 1
    alone '{"instruction": "x"}' 'no "output" key (found "instruction"), which --format alpaca needs' alpaca || return 1
    alone '{"prompt": "x", "completion": [{"role": "assistant", "content": "y"}]}' \
        'prompt is a string and completion is an array' prompt_completion || return 1
    alone '{"conversations": [{"from": "human", "value": 3}]}' 'conversations[0].value: expected a string, found a number' \
        sharegpt || return 1
    printf '{"foo": 1}\n' >data.jsonl
    expect_error "data.jsonl:1: cannot tell the format from the keys (\"foo\")" --tokenizer "$QWEN" --in data.jsonl || return 1
}

prepare_malformed_json_arrays_name_the_line() {
    printf '[{"text": "a"},\n {"text": "b"}\n {"text": "c"}]\n' >a.json
    expect_error "a.json:3: expected ',' or ']' after the record of line 2, found '{'" --tokenizer "$QWEN" --in a.json || return 1
    printf '[{"text": "a"},\n {"text": "b"\n' >b.json
    expect_error "b.json:2: the JSON array is not closed" --tokenizer "$QWEN" --in b.json || return 1
    printf '[{"text": "a"}] {}\n' >c.json
    expect_error "c.json:1: expected the end of the file after the JSON array's ']', found '{'" --tokenizer "$QWEN" \
        --in c.json || return 1
    printf '[{"text": "a"},\n 7]\n' >d.json
    expect_error "d.json:2: expected a JSON object, found a number" --tokenizer "$QWEN" --in d.json || return 1
    printf '  []\n' >e.json
    expect_error "e.json: no documents" --tokenizer "$QWEN" --in e.json || return 1
}

prepare_a_token_over_the_models_vocab_size_is_an_error() {
    expect_error "text.jsonl:1: token 1 has id 2254 >= vocab size 100" --tokenizer "$QWEN" --in "$FIX/text.jsonl" --vocab-size 100 || return 1
}

# A tiny random model with the qwen fixture's tokenizer: vocab 3011, <|im_end|> (3002) ends a turn.
make_text_model() {
    sed -e 's/"vocab_size": 384/"vocab_size": 3011/' -e 's/"eos_token_id": 258/"eos_token_id": 3002/' \
        -e 's/"bos_token_id": 256/"bos_token_id": 3000/' -e 's/"pad_token_id": 259/"pad_token_id": 3000/' \
        "$ROOT/configs/models/tiny-qwen3/config.json" >config.json
    "$CTUNE" init --config config.json --out m >/dev/null || return 1
    cp "$QWEN/tokenizer.json" "$QWEN/tokenizer_config.json" m/
}

generate_renders_the_prompt_with_the_models_chat_template() {
    make_text_model || return 1
    # HF: len(apply_chat_template([system?, user], add_generation_prompt=True)) is 39 (the template's
    # default system turn) and 35 with --system "Be brief." (expected.json, "generate")
    expect_exit 0 "$CTUNE" generate --model m --prompt "What is 2 plus 3?" --max-new-tokens 4 --device cpu --ids || return 1
    has err.txt "generate: 39 prompt tokens" || return 1
    [ "$(wc -w <out.txt)" -eq 4 ] || { echo "expected 4 ids:"; cat out.txt; return 1; }
    expect_exit 0 "$CTUNE" generate --model m --prompt "What is 2 plus 3?" --system "Be brief." --max-new-tokens 4 \
        --device cpu || return 1
    has err.txt "generate: 35 prompt tokens" || return 1
    expect_exit 0 "$CTUNE" generate --model m --prompt "hi" --chat-template chatml --max-new-tokens 2 --device cpu || return 1
    expect_exit 2 "$CTUNE" generate --model m --system "x" --prompt-ids 1,2 --device cpu || return 1
    has err.txt "--system and --chat-template go with --prompt" || return 1
}

run_test prepare_help_names_every_option
run_test prepare_text_prints_a_summary_and_writes_the_shard
run_test prepare_max_length_counts_truncated_and_skipped_records
run_test prepare_shards_are_the_same_for_any_thread_count
run_test prepare_reads_a_json_array_like_jsonl
run_test prepare_token_ids_still_need_no_tokenizer
run_test prepare_usage_errors_are_named
run_test prepare_tokenizer_problems_are_named
run_test prepare_malformed_records_name_the_line_and_the_field
run_test prepare_malformed_json_arrays_name_the_line
run_test prepare_a_token_over_the_models_vocab_size_is_an_error
run_test generate_renders_the_prompt_with_the_models_chat_template
summary
