#!/usr/bin/env bash
# Runs every test binary (build/tests/test_*) and every shell test (tests/*.test.sh),
# then prints the one summary line "N passed, N failed" (skips are named, not failed).
# A binary that dies without printing its summary counts as one failure.
set -u
build=${1:-build}
passed=0 failed=0 skipped=0
run_one() {
    local name=$1; shift
    local out rc
    out=$("$@" 2>&1); rc=$?
    printf '%s\n' "$out" | grep -v '^#summary'
    local line
    line=$(printf '%s\n' "$out" | grep '^#summary' | tail -n 1)
    if [ -z "$line" ]; then
        echo "FAIL $name: exited with status $rc before reporting its tests"
        failed=$((failed + 1))
        return
    fi
    set -- $line
    passed=$((passed + $2)); failed=$((failed + $3)); skipped=$((skipped + $4))
    if [ "$rc" -ne 0 ] && [ "$3" -eq 0 ]; then
        echo "FAIL $name: exited with status $rc"
        failed=$((failed + 1))
    fi
}
for t in "$build"/tests/test_*; do
    [ -x "$t" ] || continue
    echo "== $(basename "$t")"
    run_one "$(basename "$t")" "$t"
done
for t in tests/*.test.sh; do
    [ -f "$t" ] || continue
    echo "== $(basename "$t")"
    run_one "$(basename "$t")" env CTUNE="$build/ctune" bash "$t"
done
[ "$skipped" -gt 0 ] && echo "($skipped skipped)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
