# tokenizer.test.sh — the C tokenizer against the installed Hugging Face
# `tokenizers` on strings the stored fixtures do not have: the fixture
# tokenizers are copied, scripts/tokenizer_fixtures.py --expect-only asks HF for
# its answers on the stress corpus plus random strings, and test_tokenizer runs
# on that folder. Skipped where HF_PYTHON (default python3) lacks `tokenizers`
# (CI: the stored fixtures in test_tokenizer.c are the check there).
source "$(dirname "$0")/lib.sh"
PY=${HF_PYTHON:-python3}
BUILD_DIR=$(dirname "$CTUNE")   # lib.sh made CTUNE absolute

# fresh_fixtures SEED N: the fixture tokenizers with HF's answers on N random strings.
fresh_fixtures() {
    cp -r "$ROOT/tests/fixtures/tokenizer" fx
    "$PY" "$ROOT/scripts/tokenizer_fixtures.py" --out fx --expect-only --random "$2" --seed "$1" 2>err.txt ||
        { cat err.txt; return 1; }
}

c_tokenizer_equals_hf_on_random_strings() {
    local seed=${TOKENIZER_SEED:-$RANDOM}
    echo "seed $seed (TOKENIZER_SEED=$seed reruns it)"
    fresh_fixtures "$seed" 300 || return 1
    (cd "$ROOT" && CTUNE_TOKENIZER_FIXTURES="$T/fx" "$BUILD_DIR/tests/test_tokenizer") >out.txt 2>&1 ||
        { cat out.txt; return 1; }
    grep -q "^ok   every_fixture_tokenizer_encodes_every_corpus_string_as_hf" out.txt || { cat out.txt; return 1; }
}

stored_answers_match_the_installed_tokenizers() {
    fresh_fixtures 0 0 || return 1
    for f in "$ROOT"/tests/fixtures/tokenizer/*/expected.json; do
        name=$(basename "$(dirname "$f")")
        # the version field may differ; the answers may not
        python3 -c 'import json,sys; a,b=(json.load(open(p))["cases"] for p in sys.argv[1:]); sys.exit(a!=b)' \
            "$f" "fx/$name/expected.json" || { echo "$name: stored answers differ from $("$PY" -c 'import tokenizers; print(tokenizers.__version__)')"; return 1; }
    done
}

if "$PY" -c 'import tokenizers' 2>/dev/null; then
    run_test c_tokenizer_equals_hf_on_random_strings
    run_test stored_answers_match_the_installed_tokenizers
else
    skip_test c_tokenizer_equals_hf_on_random_strings "skipped: $PY has no tokenizers (pip install tokenizers)"
    skip_test stored_answers_match_the_installed_tokenizers "skipped: $PY has no tokenizers"
fi
summary
