# random_parity.test.sh — the stored handful of random parity cases: ctune's CPU
# loss and LoRA gradients (documents one by one, and packed) against HF
# transformers + PEFT's, for one generated config per family in
# tests/fixtures/random_parity/NAME/ (config, documents, model, adapter and HF's
# expected.safetensors, written by scripts/random_parity.py --fixtures with
# torch; case.json says how and with which versions). No torch needed here:
# build/tests/test_hf_parity does the comparison, bounds 1e-4. A case with
# dropout compares the unpacked step only (HF applied ctune's mask there).
# Sourced helpers: tests/lib.sh.
source "$(dirname "$0")/lib.sh"

TESTER=$(dirname "$CTUNE")/tests/test_hf_parity
FIXTURES=$ROOT/tests/fixtures/random_parity

check_case() { # NAME
    local d=$FIXTURES/$1 opts=()
    grep -q '"dropout_unpacked_only": true' "$d/case.json" && opts+=(--unpacked-only)
    (cd "$ROOT" && "$TESTER" "${opts[@]}" "tests/fixtures/random_parity/$1") >out.txt 2>&1 || { cat out.txt; false; }
    grep '^     ' out.txt
    grep -q '^#summary [1-9][0-9]* 0 0' out.txt || { cat out.txt; false; }
}

names=()
for d in "$FIXTURES"/*/; do
    [ -f "$d/expected.safetensors" ] && names+=("$(basename "$d")")
done
if [ ! -x "$TESTER" ]; then
    skip_test random_parity_cases "skipped: $TESTER is not built (make tests)"
elif [ ${#names[@]} -eq 0 ]; then
    skip_test random_parity_cases "skipped: no cases in $FIXTURES (scripts/random_parity.py --fixtures makes them)"
else
    for n in "${names[@]}"; do
        eval "random_case_${n}_matches_hf_peft() { check_case $n; }"
        run_test "random_case_${n}_matches_hf_peft"
    done
fi
summary
