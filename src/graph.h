/* graph.h — one micro-batch through the model: forward, loss, backward into the
 * LoRA gradients. Buffers are planned once for the largest micro-batch
 * (capacity tokens) and reused every step; nothing here waits for the device.
 *
 * Loss convention (DESIGN.md): the loss of an optimizer step is the sum of
 * per-target cross-entropies over all its micro-batches divided by their total
 * target count, so callers pass grad_scale = 1 / (targets in the whole step). */
#ifndef CT_GRAPH_H
#define CT_GRAPH_H

#include "lora.h"
#include "packer.h"

typedef struct ct_graph ct_graph;

/* capacity: most tokens in one micro-batch. checkpointing: keep only layer
 * inputs and recompute in backward (else keep every layer's intermediates). */
ct_graph *graph_new(const ct_model *m, int capacity, bool checkpointing, ct_error *err);
void graph_free(ct_graph *g);
/* Backend bytes the graph holds (activations and scratch). */
size_t graph_bytes(const ct_graph *g);

/* Uploads a micro-batch's tokens and metadata (one upload each). */
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
