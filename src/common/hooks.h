/* hooks.h — the debug and test hooks: the only environment variables ctune reads,
 * read once, the first time hooks_get is called. They exist for tests and
 * debugging scripts; kernel choices are not hooks (a backend takes them as
 * options, backend.h).
 *
 *   variable                 effect                                          used by
 *   CTUNE_TRACE=DIR          train writes the adapter before step 1 to       scripts/cpu_parity.sh,
 *                            DIR/initial_adapter and each step's documents    scripts/gpu_check.sh,
 *                            to DIR/batches.jsonl (src/train/train.c), for the HF   scripts/bench_moe.sh
 *                            replay of scripts/hf_parity.py
 *   CTUNE_INJECT_NAN_STEP=K  a NaN is written into the first LoRA gradient   tests/faults.test.sh,
 *   (or K-M)                 after the backward of steps K..M (src/train/optim.c);  scripts/gpu_check.sh
 *                            a malformed value is an input error
 *   CTUNE_INJECT_PIN_FAIL=1  host_alloc reports pinned memory as refused     tests/memory.test.sh
 *                            (src/backend/backend_cpu.c, cuda/common/offload.cu), so the
 *                            pageable fallback and its warning run
 *
 * Read by test scripts only, never by ctune: CTUNE_SANITIZED (tests run under the
 * sanitizers, Makefile's test-asan) and CTUNE_TOKENIZER_FIXTURES
 * (tests/test_tokenizer.c). docs/ARCHITECTURE.md, "Debug and test hooks". */
#ifndef CT_HOOKS_H
#define CT_HOOKS_H

#include <stdbool.h>

typedef struct ct_hooks {
    const char *trace_dir;       /* CTUNE_TRACE, NULL when unset or empty */
    const char *inject_nan_step; /* CTUNE_INJECT_NAN_STEP as written (parsed by optim.c), NULL when unset or empty */
    bool inject_pin_fail;        /* CTUNE_INJECT_PIN_FAIL starts with '1' */
} ct_hooks;

/* The hooks of this process (read on the first call; thread-safe). */
const ct_hooks *hooks_get(void);

#endif
