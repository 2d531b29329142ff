/* kernel_choice.cuh — the one place that decides which kernel runs a call where
 * more than one could: from the call's shape and, where two kept kernels serve
 * it, the backend's options (ct_cuda_options, backend.h). kernel_choice.cu
 * holds the rules, each with the measurement behind it. Only kernels some rule
 * picks are built; docs/ARCHITECTURE.md ("How kernels are chosen") names those
 * removed and the commit that last had them.
 *
 * One kernel, no rule: the grouped GEMMs without the LoRA (moe_linear_fwd,
 * through a gather or not, and moe_linear_bwd_input) always run moe_gemm_tma.cu's
 * TMA kernel (1.3-1.5x the cp.async wgmma kernel on expert-ordered rows; gathered
 * gate_up 1.56 against 1.82 ms). Rules of fit rather than speed stay with their
 * launchers: the fused expert LoRA needs a finite non-zero scale and modules on
 * 256-column tiles (moe_gemm_fused_lora.cu), the cross-entropy cluster kernel a
 * vocabulary that fits (loss.cu), the RMSNorm register kernel D <= 2048
 * (rmsnorm_rope.cu). */
#ifndef CT_KERNEL_CHOICE_CUH
#define CT_KERNEL_CHOICE_CUH

extern "C" {
#include "backend.h"
}

/* The attention forward kernels, by file. */
enum attn_fwd_choice {
    ATTN_FWD_MMA,   /* attention.cu: mma.sync, 64-query tiles; D = 32, 256 */
    ATTN_FWD_WGMMA, /* attention_fwd_sm90.cu: one warpgroup, 64-query tiles; D = 64 */
    ATTN_FWD_TMA,   /* attention_fwd_sm90_2wg.cu: TMA producer + two consumers, 128-query tiles; D = 64, 128 */
};
/* The forward for head_dim D over T tokens in n_docs documents. */
attn_fwd_choice choose_attn_fwd(ct_attn_fwd_kernel forced, int D, int T, int n_docs);

/* The attention backward kernels (delta, then dq and dk/dv), by file. */
enum attn_bwd_choice {
    ATTN_BWD_MMA,       /* attention_bwd.cu: mma.sync, 64-row tiles; D = 32 */
    ATTN_BWD_MMA_SPLIT, /* attention_bwd.cu: mma.sync dq (32-key steps), dk/dv with dk and dv on
                         * separate warps; D = 256 */
    ATTN_BWD_WGMMA,     /* attention_bwd_sm90.cu: one warpgroup per 64-row tile; D = 64 */
    ATTN_BWD_TWO_WG,    /* attention_bwd_dq_2wg.cu, attention_bwd_dkdv_2wg.cu: two warpgroups per
                         * 128-row tile; D = 128 */
};
attn_bwd_choice choose_attn_bwd(int D);

/* moe_linear_lora_fwd: the grouped GEMM forward with the expert LoRA. */
enum moe_lora_fwd_choice {
    MOE_LORA_FWD_UNFUSED,  /* moe_linear_fwd, then moe_lora_fwd per module */
    MOE_LORA_FWD_TMA,      /* moe_gemm_tma.cu with the LoRA fused (padded ranks 16, 32) */
    MOE_LORA_FWD_CP_ASYNC, /* moe_gemm_fused_lora.cu: cp.async + wgmma with the LoRA fused (padded rank 64) */
};
/* fusable: the call meets the fused kernels' conditions (moe_gemm_fused_lora.cu); RP:
 * its ranks padded to 16, 32 or 64. */
moe_lora_fwd_choice choose_moe_lora_fwd(bool fusable, int RP);

/* moe_linear_lora_bwd_input over `in` input columns at padded rank RP: whether the
 * TMA GEMM computes the LoRA factor g = dy B beside dx (else moe_lora_g computes
 * it first and the GEMM adds g A as one more k-step). */
bool choose_g_in_gemm(int in, int RP);

#endif
