/* kernel_choice.cu — see kernel_choice.cuh. Figures: H200, TFLOP/s of
 * build/bench/attn_bench (32 q / 8 kv heads, 32k tokens per call); the tables
 * are in docs/kernels/attention.md, the dated runs in docs/perf-log.md. */
#include "kernel_choice.cuh"

/* D = 32 (the tiny test models): mma.sync, the only kernel built for it.
 * D = 128: TMA, fastest at every document length (4k documents 466 against 345
 *   for one warpgroup and 242 for mma.sync).
 * D = 64: 128-query tiles waste rows at document ends, so TMA only for documents
 *   averaging 2048 tokens or more (1k documents 215 against 241 for one
 *   warpgroup; 4k 333 against 296). mma.sync: 206 at 4k. */
attn_fwd_choice choose_attn_fwd(ct_attn_fwd_kernel forced, int D, int T, int n_docs)
{
    if (D == 32) return ATTN_FWD_MMA;
    if (D == 128) return ATTN_FWD_TMA;
    if (forced == CT_ATTN_FWD_WGMMA) return ATTN_FWD_WGMMA;
    if (forced == CT_ATTN_FWD_TMA) return ATTN_FWD_TMA;
    return (size_t)T >= (size_t)2048 * (size_t)n_docs ? ATTN_FWD_TMA : ATTN_FWD_WGMMA;
}

/* D = 32: mma.sync, the only kernel built for it.
 * D = 64: one warpgroup (4k documents 267 against 195 for mma.sync); the
 *   two-warpgroup kernels are built for D = 128 only.
 * D = 128: two warpgroups for dq and for dk/dv (4k documents: dk/dv 338 against
 *   300 for one warpgroup, then dq 357 against 303; 16k 384 against 315). */
attn_bwd_choice choose_attn_bwd(int D)
{
    if (D == 32) return ATTN_BWD_MMA;
    if (D == 64) return ATTN_BWD_WGMMA;
    return ATTN_BWD_TWO_WG;
}
