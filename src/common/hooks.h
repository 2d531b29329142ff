/* hooks.h — the debug and test hooks: ctune's own environment variables (a run
 * on several GPUs also reads its launcher's, src/dist/dist.c), read once, the
 * first time hooks_get is called. They exist for tests and debugging scripts;
 * kernel choices are not hooks (a backend takes them as options, backend.h).
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
 *   CTUNE_DIST_HOST_REDUCE=1 ranks on CUDA sum gradients through rank 0's   scripts/gpu_check.sh
 *                            host over TCP instead of NCCL (src/dist/dist.c), so
 *                            several ranks can share one GPU (NCCL refuses that)
 *   CTUNE_INJECT_RANK_FAULT= rank RANK, after the backward of step STEP,     tests/dist.test.sh
 *   RANK:STEP:exit|hang      exits with status 3 or stops answering (sleeps)
 *                            (src/train/train.c); a malformed value is an input error
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
    bool dist_host_reduce;       /* CTUNE_DIST_HOST_REDUCE starts with '1' */
    const char *inject_rank_fault; /* CTUNE_INJECT_RANK_FAULT as written (parsed by train.c), NULL when unset */
} ct_hooks;

/* The hooks of this process (read on the first call; thread-safe). */
const ct_hooks *hooks_get(void);

#endif
