# eval_generate.test.sh — `ctune eval --generate FILE`: greedy generations
# scored against references, through the binary. The references are made from
# `ctune generate`'s text output for the same prompts, so a score of 100% says
# that eval renders, tokenizes, decodes and stops exactly as generate does; a
# changed reference must then cost exactly one match. Models: the tiny byte
# model of configs/models/tiny, and tiny-qwen3 with the tokenizer.json and chat
# template of tests/fixtures/prepare_text/models/qwen (random weights: the
# answers are gibberish, but deterministic).
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
QWEN=$ROOT/tests/fixtures/prepare_text/models/qwen
TEXT=$WORK/text BYTES=$WORK/bytes
sed -e 's/"vocab_size": 384/"vocab_size": 3011/' -e 's/"eos_token_id": 258/"eos_token_id": 3002/' \
    -e 's/"bos_token_id": 256/"bos_token_id": 3000/' -e 's/"pad_token_id": 259/"pad_token_id": 3000/' \
    "$ROOT/configs/models/tiny-qwen3/config.json" >"$WORK/config.json"
"$CTUNE" init --config "$WORK/config.json" --out "$TEXT" >/dev/null
cp "$QWEN/tokenizer.json" "$QWEN/tokenizer_config.json" "$TEXT/"
# seed 2: no answer below holds a NUL byte, which the text of a record may not (prepare_text.h)
"$CTUNE" init --config "$ROOT/configs/models/tiny/config.json" --out "$BYTES" --seed 2 >/dev/null
N=12   # --max-new-tokens everywhere

has() {
    grep -qF -- "$2" "$1" && return 0
    echo "expected '$2' in $1:"; cat "$1"; return 1
}

# answer MODEL ARGS...: generate's greedy text for ARGS as a JSON string
# (its final newline dropped; bytes that are not UTF-8 as U+FFFD, as eval decodes them).
answer() {
    local model=$1; shift
    "$CTUNE" generate --model "$model" --max-new-tokens $N --device cpu "$@" 2>/dev/null >answer.txt
    python3 -c '
import json, sys
t = open(sys.argv[1], "rb").read().decode("utf-8", "replace")
assert t.endswith("\n"); t = t[:-1]
assert t.strip(), "an empty answer cannot be a reference"
print(json.dumps(t))' answer.txt
}

# chat USER ANSWER_JSON: a messages record
chat() { printf '{"messages": [{"role": "user", "content": "%s"}, {"role": "assistant", "content": %s}]}\n' "$1" "$2"; }

PROMPTS=("What is 2 plus 3?" "Name a color." "hi")

# ev.jsonl: one messages record per prompt, each reference generate's answer
write_exact_file() {
    local model=$1; : >ev.jsonl
    for p in "${PROMPTS[@]}"; do chat "$p" "$(answer "$model" --prompt "$p")" >>ev.jsonl; done
}

# set_reference LINE TEXT: the last message's content of ev.jsonl's record LINE becomes TEXT
set_reference() {
    python3 - "$1" "$2" <<'PY'
import json, sys
lines = open("ev.jsonl", encoding="utf-8").read().splitlines()
r = json.loads(lines[int(sys.argv[1]) - 1])
r["messages"][-1]["content"] = sys.argv[2]
lines[int(sys.argv[1]) - 1] = json.dumps(r)
open("ev.jsonl", "w", encoding="utf-8").write("\n".join(lines) + "\n")
PY
}

evalg() { "$CTUNE" eval --max-new-tokens $N --device cpu "$@"; }

# expect_error TEXT ARGS...: eval ARGS exits 2 with one line on stderr holding TEXT
expect_error() {
    local want=$1; shift
    expect_exit 2 evalg "$@" || return 1
    has err.txt "$want" || return 1
    [ "$(wc -l <err.txt)" -eq 1 ] || { echo "expected one line:"; cat err.txt; return 1; }
}

eval_help_names_the_generate_options() {
    expect_exit 0 "$CTUNE" eval --help
    for o in --generate --metric --max-new-tokens --chat-template --system --format --field-messages --field-role \
             --field-content --field-prompt --field-completion --limit --out --adapter --device; do
        has out.txt "  $o" || return 1
    done
    has out.txt "ctune eval --model DIR --generate FILE.jsonl"
}

references_equal_to_the_greedy_answers_score_100_percent() {
    write_exact_file "$TEXT"
    expect_exit 0 evalg --model "$TEXT" --generate ev.jsonl
    has out.txt "exact match: 3/3 = 100.0% (ev.jsonl, 3 records, "
    [ "$(wc -l <out.txt)" -eq 1 ]
    has err.txt "eval: 3 records, "
    # the byte model of the tiny configs (no tokenizer.json) too
    write_exact_file "$BYTES"
    expect_exit 0 evalg --model "$BYTES" --generate ev.jsonl
    has out.txt "exact match: 3/3 = 100.0% (ev.jsonl, 3 records, "
}

one_changed_reference_costs_one_match_and_out_says_which() {
    write_exact_file "$TEXT"
    set_reference 2 "not what it says"
    expect_exit 0 evalg --model "$TEXT" --generate ev.jsonl --out res.jsonl
    has out.txt "exact match: 2/3 = 66.7% (ev.jsonl, 3 records, "
    python3 - "$TEXT" <<'PY'
import json
recs = [json.loads(l) for l in open("res.jsonl", encoding="utf-8")]
src = [json.loads(l) for l in open("ev.jsonl", encoding="utf-8")]
assert [r["index"] for r in recs] == [0, 1, 2], recs
assert [r["line"] for r in recs] == [1, 2, 3], recs
assert [r["match"] for r in recs] == [True, False, True], recs
for r, s in zip(recs, src):
    assert r["reference"] == s["messages"][1]["content"], (r, s)
    assert set(r) == {"index", "line", "prompt", "reference", "generation", "match"}, r
    # the prompt is the chat template's rendering, ending in the generation prompt
    assert r["prompt"].endswith(s["messages"][0]["content"] + "<|im_end|>\n<|im_start|>assistant\n"), r["prompt"]
assert recs[0]["generation"] == recs[0]["reference"]
assert recs[1]["generation"] != "not what it says"
PY
    # the generation of the changed record is still generate's answer
    python3 -c 'import json,sys; print(json.dumps(json.loads(open("res.jsonl").readlines()[1])["generation"]))' >g.txt
    [ "$(cat g.txt)" = "$(answer "$TEXT" --prompt "Name a color.")" ]
}

contains_scores_a_reference_inside_the_generation() {
    : >ev.jsonl
    for p in "${PROMPTS[@]}"; do
        part=$(answer "$TEXT" --prompt "$p" | python3 -c '
import json, sys
a = json.loads(sys.stdin.read()).strip()
print(json.dumps(a[len(a) // 3: 2 * len(a) // 3] or a))')
        chat "$p" "$part" >>ev.jsonl
    done
    expect_exit 0 evalg --model "$TEXT" --generate ev.jsonl --metric contains
    has out.txt "contains match: 3/3 = 100.0%"
    expect_exit 0 evalg --model "$TEXT" --generate ev.jsonl --metric exact
    has out.txt "exact match: 0/3 = 0.0%"
    set_reference 3 "nowhere in it"
    expect_exit 0 evalg --model "$TEXT" --generate ev.jsonl --metric contains
    has out.txt "contains match: 2/3 = 66.7%"
}

alpaca_sharegpt_and_prompt_completion_records_score_as_chats() {
    a1=$(answer "$TEXT" --prompt "What is 2 plus 3?")
    a2=$(answer "$TEXT" --prompt $'Add these.\n\n2 and 3')
    a3=$(answer "$TEXT" --prompt "hi" --system "Be brief.")
    {
        printf '{"instruction": "What is 2 plus 3?", "input": "", "output": %s}\n' "$a1"
        printf '{"instruction": "Add these.", "input": "2 and 3", "output": %s}\n' "$a2"
    } >alpaca.json
    expect_exit 0 evalg --model "$TEXT" --generate alpaca.json
    has out.txt "exact match: 2/2 = 100.0% (alpaca.json, 2 records"
    printf '{"prompt": [{"role": "user", "content": "What is 2 plus 3?"}], "completion": [{"role": "assistant", "content": %s}]}\n' \
        "$a1" >pc.jsonl
    printf '{"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "hi"}, {"from": "gpt", "value": %s}]}\n' \
        "$a3" >sharegpt.jsonl
    expect_exit 0 evalg --model "$TEXT" --generate pc.jsonl
    has out.txt "exact match: 1/1 = 100.0% (pc.jsonl, 1 record, "
    expect_exit 0 evalg --model "$TEXT" --generate sharegpt.jsonl
    has out.txt "exact match: 1/1 = 100.0%"
    # --system adds the system turn a conversation lacks
    chat "hi" "$a3" >sys.jsonl
    expect_exit 0 evalg --model "$TEXT" --generate sys.jsonl --system "Be brief."
    has out.txt "exact match: 1/1 = 100.0%"
    expect_exit 0 evalg --model "$TEXT" --generate sys.jsonl
    has out.txt "exact match: 0/1 = 0.0%"
    # a JSON array of records reads like JSONL; --limit takes the first ones
    python3 -c 'import json; print(json.dumps([json.loads(l) for l in open("alpaca.json")], indent=1))' >arr.json
    expect_exit 0 evalg --model "$TEXT" --generate arr.json --limit 1
    has out.txt "exact match: 1/1 = 100.0% (arr.json, 1 record, "
}

a_prompt_string_is_encoded_as_is() {
    # the byte model: the prompt "abc" is the bytes 97 98 99, no template around them
    a=$(answer "$BYTES" --prompt-ids 97,98,99)
    printf '{"prompt": "abc", "completion": %s}\n' "$a" >pc.jsonl
    expect_exit 0 evalg --model "$BYTES" --generate pc.jsonl --out res.jsonl
    has out.txt "exact match: 1/1 = 100.0%"
    has res.jsonl '"prompt": "abc"'
    # the text model: tokenizer(prompt) with the post-processor's specials (none for Qwen)
    expect_exit 0 evalg --model "$TEXT" --generate pc.jsonl --out res.jsonl
    has out.txt "exact match: 0/1"
    has res.jsonl '"prompt": "abc"'
}

malformed_records_name_the_file_line_and_field() {
    good='{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]}'
    bad() { printf '%s\n%s\n' "$good" "$1" >bad.jsonl; }
    bad '{"messages": [{"role": "user", "content": "hi"}]}'
    expect_error "bad.jsonl:2: messages: no assistant message" --model "$TEXT" --generate bad.jsonl --out res.jsonl
    [ ! -e res.jsonl ] || { echo "a failed eval wrote --out"; return 1; }
    bad '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " \n"}]}'
    expect_error "bad.jsonl:2: messages[1].content: the reference is empty" --model "$TEXT" --generate bad.jsonl
    bad '{"messages": [{"role": "assistant", "content": "x"}]}'
    expect_error "bad.jsonl:2: messages[0]: the assistant message to score has no prompt before it" \
        --model "$TEXT" --generate bad.jsonl
    bad '{"messages": [{"role": "user", "content": 7}, {"role": "assistant", "content": "x"}]}'
    expect_error "bad.jsonl:2: messages[0].content: expected a string, found a number" \
        --model "$TEXT" --generate bad.jsonl
    bad '{"messages": [{"role": "user"'
    expect_error "bad.jsonl:2: " --model "$TEXT" --generate bad.jsonl
    bad '{"text": "hello"}'
    expect_error "bad.jsonl:2: no \"messages\" key" --model "$TEXT" --generate bad.jsonl
    printf '{"instruction": "hi", "output": ""}\n' >bad.jsonl
    expect_error "bad.jsonl:1: output: the reference is empty" --model "$TEXT" --generate bad.jsonl
    printf '{"prompt": "", "completion": "x"}\n' >bad.jsonl
    expect_error "bad.jsonl:1: prompt: the prompt is empty" --model "$TEXT" --generate bad.jsonl
    printf '{"prompt": [{"role": "user", "content": "hi"}], "completion": []}\n' >bad.jsonl
    expect_error "bad.jsonl:1: completion: no assistant message" --model "$TEXT" --generate bad.jsonl
    printf '{"text": "hello"}\n' >bad.jsonl
    expect_error "bad.jsonl:1: a text record has no reference" --model "$TEXT" --generate bad.jsonl
    # a prompt that leaves no room for --max-new-tokens in max_position_embeddings (2048)
    printf '%s\n' "$good" >ok.jsonl
    expect_error "ok.jsonl:1: the prompt is 21 tokens; with --max-new-tokens 2030 that is over the model's max_position_embeddings 2048" \
        --model "$BYTES" --generate ok.jsonl --max-new-tokens 2030
    : >empty.jsonl
    expect_error "empty.jsonl: no records" --model "$TEXT" --generate empty.jsonl
}

usage_errors_are_named() {
    printf '{"instruction": "hi", "output": "x"}\n' >ok.jsonl
    expect_error "--metric 'fuzzy': expected exact or contains" --model "$TEXT" --generate ok.jsonl --metric fuzzy
    expect_error "--format text: its records have no reference" --model "$TEXT" --generate ok.jsonl --format text
    expect_error "--max-new-tokens '0': expected an integer in 1.." --model "$TEXT" --generate ok.jsonl --max-new-tokens 0
    expect_error "--generate FILE (--model missing)" --generate ok.jsonl
    expect_error "go with --generate FILE" --model "$TEXT" --data x.shard --metric contains
    expect_error "--generate takes --model DIR and its own options" --model "$TEXT" --generate ok.jsonl --data x.shard
    expect_error "--chat-template needs" --model "$BYTES" --generate ok.jsonl --chat-template chatml
    expect_exit 2 evalg --model "$TEXT" --generate missing.jsonl
    has err.txt "missing.jsonl"
}

# A few LoRA steps on the bundled data: eval --generate --adapter scores what
# generate --adapter says.
adapter_generations_are_generate_adapters() {
    "$CTUNE" train "$ROOT/configs/tiny.yaml" --set model="$BYTES" --set output_dir=run \
        --set "data.train_files=[$ROOT/data/arith/train.shard]" --set "data.eval_files=[]" \
        --set training.max_steps=4 --set training.warmup_steps=1 --set training.save_steps=100 \
        --set data.tokens_per_micro_batch=256 --set data.max_length=256 >train.out 2>&1 || { cat train.out; return 1; }
    [ -f run/final/adapter_config.json ]
    : >ev.jsonl
    for p in "${PROMPTS[@]}"; do chat "$p" "$(answer "$BYTES" --adapter run/final --prompt "$p")" >>ev.jsonl; done
    expect_exit 0 evalg --model "$BYTES" --adapter run/final --generate ev.jsonl
    has out.txt "exact match: 3/3 = 100.0%"
    has err.txt ", with adapter)"
}

run_test eval_help_names_the_generate_options
run_test references_equal_to_the_greedy_answers_score_100_percent
run_test one_changed_reference_costs_one_match_and_out_says_which
run_test contains_scores_a_reference_inside_the_generation
run_test alpaca_sharegpt_and_prompt_completion_records_score_as_chats
run_test a_prompt_string_is_encoded_as_is
run_test malformed_records_name_the_file_line_and_field
run_test usage_errors_are_named
run_test adapter_generations_are_generate_adapters
summary
