# lib.sh — sourced by tests/*.test.sh: the same "ok / FAIL / #summary" protocol
# as tests/check.h, for tests that drive the ctune binary from the shell.
# Each test is a function; run_test NAME runs it in a fresh temp folder ($T).
_passed=0 _failed=0 _skipped=0
CTUNE=${CTUNE:-build/ctune}
case $CTUNE in /*) ;; *) CTUNE=$PWD/$CTUNE ;; esac
ROOT=$PWD
run_test() {
    local name=$1
    T=$(mktemp -d)
    # Not inside an `if`: bash ignores set -e in a condition, and every command of
    # a test must count.
    (cd "$T" || exit 1; set -e; "$name") >"$T.log" 2>&1
    if [ $? -eq 0 ]; then
        echo "ok   $name"; _passed=$((_passed + 1))
    else
        echo "FAIL $name:"; sed 's/^/     /' "$T.log" | tail -n 20; _failed=$((_failed + 1))
    fi
    rm -rf "$T" "$T.log"
}
# expect_exit CODE CMD...: runs CMD, fails unless it exits with CODE.
expect_exit() {
    local want=$1; shift
    local rc=0
    "$@" >out.txt 2>err.txt || rc=$?
    if [ "$rc" -ne "$want" ]; then
        echo "expected exit $want, got $rc from: $*"; cat out.txt err.txt; return 1
    fi
}
# skip_test NAME REASON: reports NAME as skipped (check.h's format), runs nothing.
skip_test() { echo "skip $1: $2"; _skipped=$((_skipped + 1)); }
summary() { echo "#summary $_passed $_failed $_skipped"; }
