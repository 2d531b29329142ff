/* graph_moe.h — the sparse (mixture-of-experts) MLP of a decoder layer, for
 * graph.c; not a public contract. One block, for the T tokens of a micro-batch:
 *
 *   logits = hn Wr^T (+ br) ; (idx, w) = route(logits) ; counts ; offsets ; permutation
 *   gu = grouped(hn[row_slot / K], Wgu_e) (+ expert LoRA gate|up), the gather fused into the loads
 *   a = swiglu(gu) (gpt_oss: clamped, interleaved) ; ye = grouped(a, Wdown_e) (+ LoRA down)
 *   out += sum_k w[t,k] ye[row of (t,k)]
 *
 * The number of ops does not depend on E, and no op reads a count on the host.
 * Buffers are planned once for capacity tokens (capacity*K expert rows). */
#ifndef CT_GRAPH_MOE_H
#define CT_GRAPH_MOE_H

#include "arena.h"
#include "lora.h"

typedef struct ct_moe ct_moe;

/* The adapter and dropout of one step, as graph.c holds them. */
typedef struct moe_lora {
    const ct_lora *lo;   /* NULL: no adapter */
    float dropout;
    uint64_t step_seed;
} moe_lora;

/* n_ws workspaces of per-layer intermediates (1 with checkpointing, else L);
 * NULL when the model has no sparse layer. Its device buffers come from the
 * graph's arena: moe_layout takes them (in both of the arena's passes).
 * expert_lora false leaves out the fused expert LoRA's u and g buffers (the
 * adapter has no expert modules; with one, its ops then take the unfused path).
 * fused_lora false (tests) runs the expert LoRA apart from the grouped GEMMs even
 * where the fused ops could run. */
ct_moe *moe_new(const ct_model *m, int capacity, int n_ws, bool expert_lora, bool fused_lora);
void moe_layout(ct_moe *mo, ct_arena *ar);
void moe_free(ct_moe *mo);   /* host side only: the arena's owner frees the memory */

/* out (T,H) = res (T,H) + the MoE block of sparse layer l on hn (T,H), keeping what
 * backward needs in workspace ws. hn is not copied: backward reads it, so it
 * must keep its values until moe_backward of ws (graph.c's per-workspace hn
 * does). out NULL: only what backward needs (the checkpointing recompute).
 * record_stats: also add this layer's softmax sums for the load-balancing loss
 * (first forward of a step only; a checkpointing recompute must not count twice). */
void moe_forward(ct_moe *mo, const moe_lora *ml, int l, int ws, const void *hn, const void *res, void *out, int T,
                 bool record_stats);
/* dhn (T,H) = the gradient of the block's output wrt its input hn (through the
 * experts and through the router's weights), given dout (T,H), from what
 * moe_forward kept in workspace ws; LoRA gradients accumulate.
 * aux: include the load-balancing loss's gradient (moe_aux_loss ran this step). */
void moe_backward(ct_moe *mo, const moe_lora *ml, int l, int ws, const void *dout, void *dhn, int T, bool aux);

/* Load-balancing loss of one micro-batch: moe_aux_begin zeroes the softmax sums
 * before the forward that records them; moe_aux_loss then adds the loss into
 * loss_sum (device fp32) and prepares its gradient for moe_backward. */
void moe_aux_begin(ct_moe *mo);
void moe_aux_loss(ct_moe *mo, float *loss_sum, int T);

/* The seed of one module's dropout mask in one step (shared with graph.c):
 * layer * 7 + mod for the seven projections of every family (the numbering
 * before the Gated DeltaNet modules; scripts/random_parity.py reproduces it),
 * and its own range for those (2^40 + layer * 8 + mod). */
static inline uint64_t graph_module_seed(uint64_t step_seed, int layer, ct_module mod)
{
    uint64_t key = mod <= CT_MOD_DOWN ? (uint64_t)layer * 7 + mod : ((uint64_t)1 << 40) + (uint64_t)layer * 8 + mod;
    return ct_hash64(step_seed, key);
}

#endif
