/* memory_plan.h — before step 1: what the run will hold in device (and host)
 * memory, how it is laid out (checkpointing, which layer inputs are offloaded,
 * staging buffers, MLP chunking), and whether it fits. A run that does not fit
 * refuses to start with what to change; it never runs out of memory mid-run.
 *
 * The graph's share comes from graph_measure (the same layout code that then
 * allocates, so it is exact); the ops' scratch is estimated from the shapes
 * (see memory_plan.c) and reserved up front. */
#ifndef CT_MEMORY_PLAN_H
#define CT_MEMORY_PLAN_H

#include <stdio.h>

#include "config.h"
#include "graph.h"

/* Tokens per dense-MLP chunk with checkpointing: (16384, 2I) intermediates are
 * 0.9 GiB at llama3.1-8b's I, and the GEMMs stay large enough to run at speed. */
#define CT_MLP_CHUNK_TOKENS 16384
/* The shortest chunk the plan falls back to when short of memory (memory_plan.c). */
#define CT_MLP_CHUNK_TOKENS_MIN 2048
/* Device memory the plan leaves unplanned: the CUDA context's own growth,
 * cuBLAS internals, allocator rounding. */
#define CT_PLAN_MARGIN ((size_t)1 << 30)
/* host_available for a backend whose device memory is host memory (CPU):
 * offloaded inputs then come out of `available` too. */
#define CT_PLAN_SHARED (SIZE_MAX - 1)

typedef struct ct_memory_plan {
    const char *backend;
    ct_graph_options opt;     /* what graph_new_with gets */
    int layers;               /* the model's */
    ct_graph_sizes graph;
    size_t weights;           /* model weights on the device */
    size_t lora_optim;        /* LoRA parameters, gradients, AdamW moments */
    size_t workspace;         /* op scratch (reserved before step 1) */
    size_t device_total;      /* weights + lora_optim + graph (device) + workspace */
    size_t available;         /* for graph + workspace: free memory after weights and
                               * LoRA, less the margin; SIZE_MAX when unknown */
    size_t host_available;    /* host memory for offloaded inputs (SIZE_MAX: unknown;
                               * CT_PLAN_SHARED: they count against available) */
    size_t device_limit;      /* memory.gpu_memory_limit in bytes; 0: none */
    bool fits;
} ct_memory_plan;

/* The layout for a run of `capacity` tokens per micro-batch under cfg's memory
 * settings, given `available` bytes for the graph and workspace and
 * `host_available` for offloaded inputs (SIZE_MAX: unlimited; CT_PLAN_SHARED:
 * out of `available`, so offload only costs).
 * activation_offload: off = none; on = every layer input, two staging buffers
 * (one if two do not fit); auto = none if that fits, else the fewest layers
 * (from layer 0) with two buffers, else all with one. offload_buffers 1 caps
 * the staging buffers at one. checkpoint_layers auto (with checkpointing, offload
 * not on): the most layers, from the last, that keep their intermediates and
 * still fit without offload; when not even one does, as with all. With
 * checkpointing, when no layout fits, the same again with MLP chunks half as
 * long, down to CT_MLP_CHUNK_TOKENS_MIN tokens. CT_ERR_INPUT,
 * naming what to change, when nothing fits or offload is asked without checkpointing:
 * "the largest data.tokens_per_micro_batch that fits is N" under these same
 * settings (N < capacity, and N fits here), and the larger size that every
 * memory saving would allow when some is off. *plan is filled either way
 * (plan->fits says which). */
int memory_plan_choose(const ct_model *m, const ct_lora *lo, const ct_memory_config *mem, int capacity,
                       size_t available, size_t host_available, ct_memory_plan *plan, ct_error *err);
/* What the graph and workspace may take on the device: `free` (the device's
 * free memory less CT_PLAN_MARGIN), or under a limit of `limit` bytes for the
 * whole run (memory.gpu_memory_limit; 0: none) what the limit leaves after the
 * `held` bytes already allocated (weights, LoRA state) and CT_PLAN_MARGIN (the
 * CUDA context and libraries), whichever is less. */
size_t memory_plan_device_budget(size_t free, size_t limit, size_t held);
/* memory_plan_choose with what the backend and the host have free now: the
 * device's budget above (memory.gpu_memory_limit applies to a GPU only; the
 * CPU backend notes that it ignores it); for the host (and the CPU backend,
 * whose memory it is) three quarters of the least of MemAvailable and what
 * RLIMIT_AS (ulimit -v) and RLIMIT_DATA leave this process. */
int memory_plan_make(const ct_model *m, const ct_lora *lo, const ct_memory_config *mem, int capacity,
                     ct_memory_plan *plan, ct_error *err);
/* The op scratch the backend needs for these shapes at most: the CUDA
 * backend's reserved scratch, or the largest per-call allocation of the CPU
 * ops. */
size_t memory_plan_workspace(const ct_model *m, const ct_lora *lo, int capacity);
void memory_plan_print(const ct_memory_plan *p, FILE *f);

#endif
