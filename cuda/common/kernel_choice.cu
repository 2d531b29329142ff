/* kernel_choice.cu — see kernel_choice.cuh. Figures: H200, TFLOP/s of
 * build/bench/attn_bench (32 q / 8 kv heads, 32k tokens per call) or
 * milliseconds of build/bench/moe_gemm_bench and moe_layer_bench (qwen3-30b-a3b
 * shapes unless stated); the tables are in docs/kernels/attention.md and
 * docs/kernels/moe_gemm.md, the dated runs in docs/perf-log.md. */
#include "kernel_choice.cuh"
#include "moe_gemm.cuh"

/* D = 32 (the tiny test models): mma.sync, the only kernel built for it.
 * D = 256 (Qwen3.5 / Qwen3-Next full attention): mma.sync with 32-key steps, the
 *   only kernel built for it (the wgmma kernels are written for D <= 128); not
 *   yet measured.
 * D = 128: TMA, fastest at every document length (4k documents 466 against 345
 *   for one warpgroup and 242 for mma.sync).
 * D = 64: 128-query tiles waste rows at document ends, so TMA only for documents
 *   averaging 2048 tokens or more (1k documents 215 against 241 for one
 *   warpgroup; 4k 333 against 296). mma.sync: 206 at 4k. */
attn_fwd_choice choose_attn_fwd(ct_attn_fwd_kernel forced, int D, int T, int n_docs)
{
    if (D == 32 || D == 256) return ATTN_FWD_MMA;
    if (D == 128) return ATTN_FWD_TMA;
    if (forced == CT_ATTN_FWD_WGMMA) return ATTN_FWD_WGMMA;
    if (forced == CT_ATTN_FWD_TMA) return ATTN_FWD_TMA;
    return (size_t)T >= (size_t)2048 * (size_t)n_docs ? ATTN_FWD_TMA : ATTN_FWD_WGMMA;
}

/* D = 32: mma.sync, the only kernel built for it.
 * D = 64: one warpgroup (4k documents 267 against 195 for mma.sync); the
 *   two-warpgroup kernels are built for D = 128 only.
 * D = 128: two warpgroups for dq and for dk/dv (4k documents: dk/dv 338 against
 *   300 for one warpgroup, then dq 357 against 303; 16k 384 against 315).
 * D = 256: mma.sync dq and the split dk/dv, the only kernels built for it (dk
 *   and dv of one warp's 16 keys would need 256 registers a thread); not yet
 *   measured. */
attn_bwd_choice choose_attn_bwd(int D)
{
    if (D == 32) return ATTN_BWD_MMA;
    if (D == 256) return ATTN_BWD_MMA_SPLIT;
    if (D == 64) return ATTN_BWD_WGMMA;
    return ATTN_BWD_TWO_WG;
}

/* Fused (gate_up + LoRA through the gather 2.25 ms on cp.async + wgmma, 2.58 as
 * the GEMM and moe_lora_fwd apart), on TMA where its ring holds the rank's LoRA
 * slices (RP 16, 32: gate_up 1.82 against 2.25 on cp.async, down 0.87 against
 * 1.17); RP 64 does not fit and runs on cp.async. */
moe_lora_fwd_choice choose_moe_lora_fwd(bool fusable, int RP)
{
    if (!fusable) return MOE_LORA_FWD_UNFUSED;
    return moe_gemm_tma_fuses(RP) ? MOE_LORA_FWD_TMA : MOE_LORA_FWD_CP_ASYNC;
}

/* g in the GEMM saves a pass over dy but is recomputed in every column tile of
 * dx, so only up to 2048 input columns (one MoE layer forward + backward:
 * qwen3-30b-a3b, in 2048 and 768, 6.18 ms against 6.33 with moe_lora_g;
 * gpt-oss-20b, in 2880, 14.48 against 13.90), and only at the ranks the TMA
 * kernel fuses. */
bool choose_g_in_gemm(int in, int RP)
{
    return moe_gemm_tma_fuses(RP) && in <= 2048;
}
