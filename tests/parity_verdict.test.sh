# parity_verdict.test.sh — the pass/fail logic of scripts/hf_parity.py (its
# compare and verdict: pure Python, no torch), which decides the GPU parity
# checks of scripts/gpu_check.sh, on synthetic ctune metrics and HF histories;
# and its judge of whether PEFT loaded the whole adapter, on synthetic names.
# The GPU runs themselves need a GPU and torch; this is the part CI can check.
source "$(dirname "$0")/lib.sh"

# py SNIPPET: runs SNIPPET after importing hf_parity with a helper run(...) that
# calls compare() and returns (exit status, printed text).
py() {
    python3 - "$ROOT/scripts" "$1" <<'PY'
import contextlib, io, sys, types
sys.path.insert(0, sys.argv[1])
import hf_parity

def run(ctune, hf, tol_first=None, tol_loss=None, gnorm=None, hf_gnorm=None, log_every=1):
    """ctune: the loss ctune logged per step (a window's mean when log_every > 1),
    hf: HF's per-step (loss sum, targets) as its replay keeps them."""
    n = len(hf)
    metrics = {}
    for k in range(log_every, n + 1, log_every):
        m = {"loss": ctune[k // log_every - 1], "lr": 1e-3}
        if gnorm is not None:
            m["grad_norm"] = gnorm[k // log_every - 1]
        metrics[k] = m
    hist = {j + 1: (hf[j][0], hf[j][1], (hf_gnorm or [1.0] * n)[j], 1e-3) for j in range(n)}
    args = types.SimpleNamespace(tol_first=tol_first, tol_loss=tol_loss, out=None, metrics="metrics.jsonl")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = hf_parity.compare(args, metrics, hist, n)
    return rc, buf.getvalue()

exec(sys.argv[2])
PY
}

agreeing_runs_pass() {
    py '
rc, out = run([2.0, 1.9, 1.8], [(200.0, 100), (190.0, 100), (180.5, 100)], tol_first=1e-2, tol_loss=1e-2,
              gnorm=[0.5, 0.4, 0.3], hf_gnorm=[0.501, 0.4, 0.3])
print(out)
assert rc == 0 and "PASS parity" in out and "FAIL" not in out, (rc, out)
'
}

a_later_loss_past_the_bound_fails() {
    py '
rc, out = run([2.0, 1.9, 1.8], [(200.0, 100), (190.0, 100), (176.0, 100)], tol_first=1e-2, tol_loss=1e-2)
print(out)
assert rc == 1 and "FAIL parity: loss over 3 steps" in out, (rc, out)
'
}

the_first_steps_grad_norm_past_the_bound_fails() {
    py '
rc, out = run([2.0, 1.9], [(200.0, 100), (190.0, 100)], tol_first=1e-2, tol_loss=1e-1,
              gnorm=[0.5, 0.4], hf_gnorm=[0.45, 0.4])
print(out)
assert rc == 1 and "step 1 grad norm" in out and "FAIL parity" in out, (rc, out)
'
}

the_first_grad_norm_bound_reads_the_first_step_only() {
    # step 1 logged without a grad norm: step 2's (off by 10%) is not step 1's
    py '
m = {1: {"loss": 2.0, "lr": 1e-3}, 2: {"loss": 1.9, "lr": 1e-3, "grad_norm": 0.44}}
hist = {1: (200.0, 100, 0.5, 1e-3), 2: (190.0, 100, 0.4, 1e-3)}
args = types.SimpleNamespace(tol_first=1e-2, tol_loss=1e-2, out=None, metrics="metrics.jsonl")
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    rc = hf_parity.compare(args, m, hist, 2)
out = buf.getvalue()
print(out)
assert rc == 0 and "PASS parity" in out and "grad norm" not in out.split("PASS parity")[1], (rc, out)
'
}

a_nan_loss_never_passes() {
    py '
rc, out = run([2.0, float("nan")], [(200.0, 100), (190.0, 100)], tol_first=1e-2, tol_loss=1.0)
print(out)
assert rc == 1 and "FAIL parity" in out, (rc, out)
'
}

a_logged_window_is_compared_with_the_mean_of_its_steps() {
    # ctune logs every 2nd step the mean over the window, weighted by targets:
    # (350 + 150) / (150 + 50) = 2.5; step 2 alone would be 150 / 50 = 3.0
    py '
rc, out = run([2.5], [(350.0, 150), (150.0, 50)], tol_first=1e-6, tol_loss=1e-6, log_every=2)
print(out)
assert rc == 0 and "PASS parity" in out, (rc, out)
rc, out = run([3.0], [(350.0, 150), (150.0, 50)], tol_first=1e-6, tol_loss=1e-6, log_every=2)
assert rc == 1, (rc, out)
'
}

without_bounds_it_reports_and_does_not_judge() {
    py '
rc, out = run([2.0, 5.0], [(200.0, 100), (190.0, 100)])
print(out)
assert rc == 0 and "parity" not in out and "max rel diff (loss)" in out, (rc, out)
'
}

# judged(SAVED, LOADED, DIFFER): judge_loaded's exit status and stderr
judged_py='
def judged(saved, loaded, differ=()):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            n = hf_parity.judge_loaded("ad", set(saved), set(loaded), list(differ))
        return 0, err.getvalue(), n
    except SystemExit as e:
        return e.code, err.getvalue(), None
'

a_fully_loaded_adapter_passes() {
    py "$judged_py"'
rc, err, n = judged(["a.lora_A.weight", "a.lora_B.weight"], ["a.lora_A.weight", "a.lora_B.weight"])
assert rc == 0 and n == 2 and not err, (rc, err)
'
}

a_tensor_peft_left_unloaded_fails_naming_it() {
    # PEFT 0.21 on transformers v5 once left a qwen3_moe dense layer's MLP plain
    py "$judged_py"'
saved = ["l0.q_proj.lora_A.weight", "l1.mlp.gate_proj.lora_A.weight", "l1.mlp.gate_proj.lora_B.weight"]
rc, err, _ = judged(saved, saved[:1])
print(err)
assert rc == 3 and "were not loaded by PEFT" in err and err.startswith("ad: 2 of"), (rc, err)
assert "l1.mlp.gate_proj.lora_A.weight" in err and "l1.mlp.gate_proj.lora_B.weight" in err, err
'
}

values_other_than_the_files_or_extra_parameters_fail() {
    py "$judged_py"'
rc, err, _ = judged(["a.lora_A.weight"], ["a.lora_A.weight"], differ=["a.lora_A.weight"])
assert rc == 3 and "other values" in err, (rc, err)
rc, err, _ = judged(["a.lora_A.weight"], ["a.lora_A.weight", "b.lora_A.weight"])
assert rc == 3 and "lacks" in err and "b.lora_A.weight" in err, (rc, err)
'
}

if ! command -v python3 >/dev/null; then
    echo "skipped: no python3"; echo "#summary 0 0 1"; exit 0
fi
run_test agreeing_runs_pass
run_test a_later_loss_past_the_bound_fails
run_test the_first_steps_grad_norm_past_the_bound_fails
run_test the_first_grad_norm_bound_reads_the_first_step_only
run_test a_nan_loss_never_passes
run_test a_logged_window_is_compared_with_the_mean_of_its_steps
run_test without_bounds_it_reports_and_does_not_judge
run_test a_fully_loaded_adapter_passes
run_test a_tensor_peft_left_unloaded_fails_naming_it
run_test values_other_than_the_files_or_extra_parameters_fail
summary
