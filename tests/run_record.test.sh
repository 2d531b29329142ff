# run_record.test.sh — scripts/run_record.py, which turns each benchmark run into
# a record, refuses a first step that disagrees with the steps after it (the
# timing drops the warm-up, where a wrong first step once hid), on synthetic
# metrics.jsonl files.
source "$(dirname "$0")/lib.sh"

# metrics LOSS1 GNORM1: a run folder whose step 1 has these, steps 2..4 the usual values
metrics() {
    mkdir -p run
    {
        echo "{\"step\": 1, \"loss\": $1, \"grad_norm\": $2, \"tokens_per_second\": 900000}"
        for s in 2 3 4; do echo "{\"step\": $s, \"loss\": 12.57$s, \"grad_norm\": 0.144, \"tokens_per_second\": 1000}"; done
    } >run/metrics.jsonl
}
record() { python3 "$ROOT/scripts/run_record.py" run /dev/null 0 1 0 2>err.txt; }

test_a_right_first_step_passes() {
    metrics 12.564 0.144
    record | grep -q '"first_step_ok": true'
    record | grep -q '"error": null'
}

test_the_all_equal_logits_first_step_fails() {
    metrics 11.7785 0.00001 # what the zeroed first batch gave: ln(vocab)-like loss, no gradient
    record | grep -q '"first_step_ok": false'
    grep -q "FAIL first step disagrees" err.txt
}

test_a_zero_grad_norm_fails_even_with_the_right_loss() {
    metrics 12.571 0
    record | grep -q '"first_step_ok": false'
}

test_a_first_step_loss_off_by_five_percent_fails() {
    metrics 13.2 0.144
    record | grep -q '"first_step_ok": false'
}

test_the_timing_still_drops_the_warmup() {
    metrics 12.564 0.144
    record | grep -q '"tokens_per_s": 1000'
}

command -v python3 >/dev/null || { skip_test run_record "skipped: no python3"; summary; exit 0; }
run_test test_a_right_first_step_passes
run_test test_the_all_equal_logits_first_step_fails
run_test test_a_zero_grad_norm_fails_even_with_the_right_loss
run_test test_a_first_step_loss_off_by_five_percent_fails
run_test test_the_timing_still_drops_the_warmup
summary
