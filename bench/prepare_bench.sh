#!/usr/bin/env bash
# prepare_bench.sh — throughput of `ctune prepare --tokenizer` on generated chat
# JSONL (multi-turn conversations with a system turn; English, some accents,
# CJK, digits and code), at each thread count, with the assistant-only mask.
#
#   bash bench/prepare_bench.sh [MODEL_DIR] [MB] [THREADS...]
#       MODEL_DIR  a folder with tokenizer.json (default: the qwen fixture,
#                  tests/fixtures/prepare_text/models/qwen, a 3k vocabulary);
#                  without a chat template in it, --chat-template chatml is used
#       MB         size of the generated input (default 100)
#       THREADS    thread counts to run (default: 1 2)
#   CTUNE=build/ctune  the binary;  HF=1  also times scripts/prepare_data.py
#   (--jsonl-only, transformers) on the first 5% of the input, as a reference.
#
# Prints one line per run: records, tokens, label %, wall seconds, tokens/s and
# MB/s of input, and the CPU seconds (user + system) with tokens per CPU second:
# on a machine shared with other jobs the wall clock of N threads says little,
# the CPU time says what the work costs. Then checks that every run wrote the
# same shard.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODEL=${1:-$ROOT/tests/fixtures/prepare_text/models/qwen}
MB=${2:-100}
shift $(( $# > 2 ? 2 : $# ))
THREADS=${*:-1 2}
CTUNE=${CTUNE:-$ROOT/build/ctune}
[ -x "$CTUNE" ] || { echo "error: $CTUNE not found (make, or set CTUNE)" >&2; exit 1; }
[ -f "$MODEL/tokenizer.json" ] || { echo "error: $MODEL/tokenizer.json not found" >&2; exit 2; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

python3 - "$WORK/chat.jsonl" "$MB" <<'EOF'
import json, random, sys
path, mb = sys.argv[1], float(sys.argv[2])
rng = random.Random(28)
words = ("the of and to in is that for it as was with be by on not he this are or his from at which but have "
         "an they you were her she there been one all we their has would when if so no what can more out other "
         "model training data loss gradient adapter token layer attention memory batch step learning rate").split()
extra = ["café", "naïve", "Größe", "São Paulo", "東京", "模型训练", "데이터", "αβγ", "π≈3.14159", "🙂", "x = f(y) + 2",
         "for i in range(10):", "x<sub>2</sub>", "$HOME/run", "12,345.67", "2025-03-09"]
def sentence():
    n = rng.randint(4, 24)
    s = " ".join(rng.choice(words) if rng.random() > 0.08 else rng.choice(extra) for _ in range(n))
    return s[0].upper() + s[1:] + rng.choice([".", "?", "!", ":"])
def turn():
    return " ".join(sentence() for _ in range(rng.randint(1, 6))) + ("\n\n" + sentence() if rng.random() < 0.3 else "")
target = int(mb * 1e6)
written = 0
with open(path, "w", encoding="utf-8") as f:
    while written < target:
        msgs = [{"role": "system", "content": "You are a helpful assistant. " + sentence()}]
        for _ in range(rng.randint(1, 4)):
            msgs.append({"role": "user", "content": turn()})
            msgs.append({"role": "assistant", "content": turn()})
        line = json.dumps({"messages": msgs}, ensure_ascii=False) + "\n"
        f.write(line)
        written += len(line.encode("utf-8"))
EOF
bytes=$(stat -c %s "$WORK/chat.jsonl")
template=()
[ -f "$MODEL/chat_template.jinja" ] || grep -q '"chat_template"' "$MODEL/tokenizer_config.json" 2>/dev/null ||
    template=(--chat-template chatml)
echo "input: $(awk -v b="$bytes" 'BEGIN { printf "%.1f MB", b / 1e6 }'), $(wc -l <"$WORK/chat.jsonl") chats; model: $MODEL; $(nproc) CPUs online"
first=
for t in $THREADS; do
    start=$(date +%s.%N)
    /usr/bin/time -f "%U %S" -o "$WORK/time.txt" \
        "$CTUNE" prepare --tokenizer "$MODEL" --in "$WORK/chat.jsonl" --out "$WORK/t$t" --threads "$t" "${template[@]}" \
        >"$WORK/out.txt" 2>&1 || { cat "$WORK/out.txt"; exit 1; }
    end=$(date +%s.%N)
    line=$(grep -m1 'records' "$WORK/out.txt")
    cpu=$(awk '{ print $1 + $2 }' "$WORK/time.txt")
    awk -v s="$start" -v e="$end" -v b="$bytes" -v t="$t" -v l="$line" -v cpu="$cpu" 'BEGIN {
        split(l, f, /[ ,;]+/); tokens = 0
        for (i = 1; i in f; i++) if (f[i + 1] == "tokens" && f[i] ~ /^[0-9]+$/) { tokens = f[i]; break }
        match(l, /[0-9.]+% labels/); labels = substr(l, RSTART, RLENGTH)
        match(l, /[0-9]+ messages records/); recs = substr(l, RSTART, RLENGTH)
        d = e - s
        printf "threads %-2d %s, %d tokens, %s: %.2f s, %.0f tokens/s, %.1f MB/s; CPU %.2f s, %.0f tokens per CPU s\n",
               t, recs, tokens, labels, d, tokens / d, b / d / 1e6, cpu, tokens / cpu }'
    if [ -z "$first" ]; then first=$WORK/t$t/train.shard; else cmp "$first" "$WORK/t$t/train.shard"; fi
done
echo "shards: identical for threads $THREADS"

if [ "${HF:-0}" = 1 ]; then
    n=$(( $(wc -l <"$WORK/chat.jsonl") / 20 ))
    head -n "$n" "$WORK/chat.jsonl" >"$WORK/part.jsonl"
    pb=$(stat -c %s "$WORK/part.jsonl")
    start=$(date +%s.%N)
    /usr/bin/time -f "%U %S" -o "$WORK/time.txt" "${PYTHON:-python3}" "$ROOT/scripts/prepare_data.py" --in "$WORK/part.jsonl" --tokenizer "$MODEL" --out "$WORK/hf" \
        --jsonl-only 2>"$WORK/hf.txt" || { cat "$WORK/hf.txt"; exit 1; }
    end=$(date +%s.%N)
    tokens=$(grep -o '[0-9]* tokens, ' "$WORK/hf.txt" | grep -o '^[0-9]*')
    cpu=$(awk '{ print $1 + $2 }' "$WORK/time.txt")
    awk -v s="$start" -v e="$end" -v b="$pb" -v n="$tokens" -v cpu="$cpu" 'BEGIN {
        d = e - s; printf "prepare_data.py (HF, 1 process) on %.1f MB: %d tokens, %.2f s, %.0f tokens/s, %.1f MB/s; CPU %.2f s, %.0f tokens per CPU s\n",
                   b / 1e6, n, d, n / d, b / d / 1e6, cpu, n / cpu }'
fi
