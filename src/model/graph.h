/* graph.h — one micro-batch through the model: forward, loss, backward into the
 * LoRA gradients. Buffers are planned once for the largest micro-batch
 * (capacity tokens) and reused every step; nothing here waits for the device.
 *
 * Loss convention (docs/ARCHITECTURE.md): the loss of an optimizer step is the sum of
 * per-target cross-entropies over all its micro-batches divided by their total
 * target count, so callers pass grad_scale = 1 / (targets in the whole step). */
#ifndef CT_GRAPH_H
#define CT_GRAPH_H

#include "lora.h"
#include "packer.h"

typedef struct ct_graph ct_graph;

typedef struct ct_graph_options {
    int capacity;         /* most tokens in one micro-batch */
    bool checkpointing;   /* keep only layer inputs and recompute in backward
                           * (else keep every layer's intermediates) */
    int offload_layers;   /* with checkpointing: the inputs of layers 0 .. n-1 live in
                           * host memory (memory plan); 0 = none */
    int offload_buffers;  /* device staging buffers for them: 2 overlaps copies with
                           * compute, 1 does not */
    int mlp_chunk;        /* with checkpointing: the dense MLP runs over chunks of this
                           * many tokens (0 = the whole micro-batch). Later chunks draw
                           * their own LoRA dropout masks. */
    int keep_layers;      /* with checkpointing: the last keep_layers layers keep their
                           * intermediates and are not recomputed in backward (memory
                           * plan: memory.checkpoint_layers auto); 0 = every layer is
                           * recomputed. Results are bit-identical for every value. */
    int lora_rank;        /* r of the adapter trained on this graph: each layer keeps the
                           * u = x A^T of its dense LoRA modules for their backward, which
                           * then reads x once less (T x r per module and layer); 0 =
                           * nothing kept, backward recomputes u (same bits either way) */
    bool no_expert_lora;  /* the experts carry no LoRA (memory plan): a mixture-of-experts
                           * graph leaves out the buffers of the fused expert LoRA's u and
                           * g (n x 64 each per workspace); false keeps them, for any adapter */
    bool separate_expert_lora; /* tests: the expert LoRA forward apart from the grouped GEMM,
                           * and gate's and up's LoRA backward one by one, where the fused
                           * forms would run (dropout 0); results within rounding. Train,
                           * eval and generate leave it false */
} ct_graph_options;

/* Bytes by what they are for (the memory plan prints them). */
typedef struct ct_graph_sizes {
    size_t saved_device;  /* layer inputs kept on the device */
    size_t staging;       /* device buffers offloaded inputs pass through */
    size_t working;       /* one layer's intermediates (all layers' without
                           * checkpointing), backward scratch, MoE routing */
    size_t batch;         /* tokens and packing metadata */
    size_t host;          /* offloaded layer inputs in host memory */
} ct_graph_sizes;

/* All device buffers are one backend allocation ("arena"), planned before it is
 * made; CT_ERR_RUNTIME when it (or the host memory for offload) cannot be had. */
ct_graph *graph_new_with(const ct_model *m, const ct_graph_options *opt, ct_error *err);
/* graph_new_with with checkpointing as given and nothing else. */
ct_graph *graph_new(const ct_model *m, int capacity, bool checkpointing, ct_error *err);
void graph_free(ct_graph *g);
/* What graph_new_with(m, opt) would allocate, without allocating. */
void graph_measure(const ct_model *m, const ct_graph_options *opt, ct_graph_sizes *sizes);
const ct_graph_sizes *graph_sizes(const ct_graph *g);
/* Backend bytes the graph holds (activations and scratch). */
size_t graph_bytes(const ct_graph *g);
/* Whether the offloaded inputs' host memory is page-locked (false: the backend
 * fell back to pageable memory; copies are slower). */
bool graph_host_pinned(const ct_graph *g);

/* Queues a micro-batch's tokens and metadata for upload: one copy from
 * page-locked staging on the backend's copy stream, overlapping the work still
 * running (two device sets alternate); the next step's ops wait for it. */
void graph_set_batch(ct_graph *g, const ct_batch *b);
/* Forward + loss + backward; adds sum of losses into the device scalar returned by
 * graph_loss_sum and LoRA gradients into lo->grads. dropout_seed varies per step. */
void graph_train_step(ct_graph *g, const ct_lora *lo, float grad_scale, uint64_t dropout_seed);
/* Forward + loss only (eval; no dropout). lo may be NULL (base model). */
void graph_eval(ct_graph *g, const ct_lora *lo);
float *graph_loss_sum(ct_graph *g);   /* device fp32 scalar; the caller zeroes it */

/* Mixture-of-experts models: adds the router load-balancing loss (HF's Switch
 * loss over all sparse layers of a micro-batch, times the model's
 * router_aux_loss_coef) to every training micro-batch that has targets, and its
 * gradient to the LoRA gradients. Like HF's Trainer, it is added per
 * micro-batch, not divided by gradient accumulation, and does not scale with
 * grad_scale; eval never includes it. CT_ERR_INPUT for a dense model or gpt_oss. */
int graph_set_router_aux_loss(ct_graph *g, bool on, ct_error *err);
/* device fp32 scalar: the sum of the load-balancing losses added (coefficient
 * included) since the caller last zeroed it. */
float *graph_aux_loss_sum(ct_graph *g);

#endif
