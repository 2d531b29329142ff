#!/usr/bin/env bash
# prepare_data.test.sh — scripts/prepare_data.py and scripts/byte_tokenizer.py:
# the byte tokenizer, the chat template, the assistant-only labels, bad input,
# and the bundled data set. Needs python3 only; the ctune binary is used by the
# last test alone, which is skipped when $CTUNE is missing.
source tests/lib.sh
PREP=$ROOT/scripts/prepare_data.py

byte_tokenizer_round_trips_text_and_names_specials() {
    python3 - "$ROOT/scripts" <<'EOF'
import sys
sys.path.insert(0, sys.argv[1])
import byte_tokenizer as bt
for text in ["", "Tom has 23 apples.\n", "naïve café — 東京 🙂", "<|im_end|> is text here"]:
    ids = bt.encode(text)
    assert all(0 <= i < 256 for i in ids), ids
    assert bt.decode(ids) == text, (text, bt.decode(ids))
assert bt.encode("<|im_end|>") != [bt.IM_END]
assert bt.decode([bt.IM_START] + bt.encode("user") + [10, bt.IM_END, bt.ENDOFTEXT, bt.PAD]) \
    == "<|im_start|>user\n<|im_end|><|endoftext|><|pad|>"
assert (bt.ENDOFTEXT, bt.IM_START, bt.IM_END, bt.PAD, bt.VOCAB_SIZE) == (256, 257, 258, 259, 384)
EOF
}

assistant_only_labels_cover_content_and_im_end_of_both_turns() {
    cat > chat.jsonl <<'EOF'
{"messages":[{"role":"user","content":"What is 2 plus 3?"},{"role":"assistant","content":"2 + 3 = 5."},{"role":"user","content":"And 4 times 5?"},{"role":"assistant","content":"4 * 5 = 20."}]}
EOF
    python3 "$PREP" --in chat.jsonl --tokenizer bytes --out out --split-name train --jsonl-only
    python3 - out/train.ids.jsonl <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 1, rows
ids, labels = rows[0]["input_ids"], rows[0]["labels"]
# Expected, built by hand: header and trailing "\n" unlabelled; assistant content + <|im_end|> labelled.
def b(s): return list(s.encode())
want_ids, want_labels = [], []
for role, content in [("user", "What is 2 plus 3?"), ("assistant", "2 + 3 = 5."),
                      ("user", "And 4 times 5?"), ("assistant", "4 * 5 = 20.")]:
    head = [257] + b(role) + [10]
    body = b(content) + [258]
    want_ids += head + body + [10]
    want_labels += [-100] * len(head) + (body if role == "assistant" else [-100] * len(body)) + [-100]
assert ids == want_ids, ids
assert labels == want_labels, labels
EOF
}

text_sample_labels_every_token_and_ends_with_endoftext() {
    printf '{"text":"hello"}\n' > text.jsonl
    python3 "$PREP" --in text.jsonl --out out --jsonl-only
    python3 -c '
import json, sys
r = json.loads(open("out/data.ids.jsonl").readline())
assert r["input_ids"] == list(b"hello") + [256], r
assert r["labels"] == r["input_ids"], r'
}

malformed_line_exits_2_naming_its_line_number() {
    cat > bad.jsonl <<'EOF'
{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}

{"messages":[{"role":"user","content":"a"},
EOF
    expect_exit 2 python3 "$PREP" --in bad.jsonl --out out --jsonl-only
    grep -q 'bad.jsonl:3: invalid JSON' err.txt || { cat err.txt; exit 1; }
    [ ! -e out/data.ids.jsonl ]
}

chat_without_assistant_turn_exits_2_naming_its_line_number() {
    printf '{"text":"ok"}\n{"messages":[{"role":"user","content":"hi"}]}\n' > noasst.jsonl
    expect_exit 2 python3 "$PREP" --in noasst.jsonl --out out --jsonl-only
    grep -q 'noasst.jsonl:2: no assistant message' err.txt || { cat err.txt; exit 1; }
}

max_length_truncates_counts_and_drops_samples_left_without_loss() {
    cat > long.jsonl <<'EOF'
{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"a long enough reply"}]}
{"messages":[{"role":"user","content":"a question far longer than the limit"},{"role":"assistant","content":"x"}]}
EOF
    python3 "$PREP" --in long.jsonl --out out --max-length 30 --jsonl-only 2>log.txt
    grep -q '2 truncated to 30 tokens, 1 of them dropped' log.txt || { cat log.txt; exit 1; }
    python3 -c '
import json
rows = [json.loads(l) for l in open("out/data.ids.jsonl")]
assert len(rows) == 1 and len(rows[0]["input_ids"]) == 30 and len(rows[0]["labels"]) == 30, rows'
}

split_name_moves_ctune_train_shard_to_name_shard() {
    # A stand-in for `ctune prepare` that records its arguments and writes both shards.
    cat > fake_ctune <<'EOF'
#!/usr/bin/env bash
echo "$@" > "$(dirname "$0")/args.txt"
while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
echo train > "$out/train.shard"; echo eval > "$out/eval.shard"
EOF
    chmod +x fake_ctune
    printf '{"text":"hello"}\n' > text.jsonl
    python3 "$PREP" --in text.jsonl --out out --split-name eval --ctune ./fake_ctune
    [ "$(cat out/eval.shard)" = train ]
    [ "$(ls -A out)" = eval.shard ]
    grep -q -- '--vocab-size 384 --eval-fraction 0' args.txt || { cat args.txt; exit 1; }
}

bundled_arith_data_matches_its_generator() {
    python3 "$ROOT/data/make_arith.py" --out gen >/dev/null
    cmp gen/chat_train.jsonl "$ROOT/data/arith/chat_train.jsonl"
    cmp gen/chat_eval.jsonl "$ROOT/data/arith/chat_eval.jsonl"
    [ "$(wc -l < gen/chat_train.jsonl)" -eq 3000 ] && [ "$(wc -l < gen/chat_eval.jsonl)" -eq 200 ]
    python3 -c '
import json
q = lambda f: [json.loads(l)["messages"][0]["content"] for l in open(f)]
train, ev = q("gen/chat_train.jsonl"), q("gen/chat_eval.jsonl")
assert len(set(train)) == len(train) and not set(train) & set(ev)'
}

ctune_prepare_writes_the_named_shard() {
    python3 "$PREP" --in "$ROOT/data/arith/chat_eval.jsonl" --out out --split-name eval --ctune "$CTUNE"
    [ -s out/eval.shard ]
    [ "$(ls -A out)" = eval.shard ]
}

run_test byte_tokenizer_round_trips_text_and_names_specials
run_test assistant_only_labels_cover_content_and_im_end_of_both_turns
run_test text_sample_labels_every_token_and_ends_with_endoftext
run_test malformed_line_exits_2_naming_its_line_number
run_test chat_without_assistant_turn_exits_2_naming_its_line_number
run_test max_length_truncates_counts_and_drops_samples_left_without_loss
run_test split_name_moves_ctune_train_shard_to_name_shard
run_test bundled_arith_data_matches_its_generator
if [ -x "$CTUNE" ]; then
    run_test ctune_prepare_writes_the_named_shard
else
    echo "skip ctune_prepare_writes_the_named_shard: no binary at $CTUNE"; _skipped=$((_skipped + 1))
fi
summary
