/* train.c — the training loop (see train.h). One optimizer step:
 *   take gradient_accumulation_steps micro-batches from the loader thread; their
 *   target count (known on the host) fixes grad_scale = 1 / targets, so the loss
 *   is the mean over the step's target tokens however the data is packed;
 *   forward + backward each; clip + AdamW on the backend. The loss and grad norm
 *   are read back only on logging steps.
 * A checkpoint holds all the loop carries from step to step (adapter, moments,
 * data position, the logging window, the non-finite guard), so a resumed run
 * takes, and logs, the steps of an uninterrupted one; resume_check.h decides
 * whether the config it is resumed under allows that. */
#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adapter.h"
#include "checkpoint.h"
#include "dist.h"
#include "graph.h"
#include "hooks.h"
#include "interrupt.h"
#include "memory_plan.h"
#include "log.h"
#include "metrics.h"
#include "optim.h"
#include "resume_check.h"

typedef struct run {
    const ct_config *cfg;
    ct_backend *be;
    ct_model model;
    ct_lora lora;
    ct_dataset train_ds, eval_ds;
    bool has_eval;
    ct_packer *packer, *eval_packer;
    ct_loader *loader;
    ct_graph *graph;
    ct_log log;
    ct_guard guard;           /* per-step gradient norms; skips and counts non-finite steps */
    int total_steps;
    ct_trainer_state state;   /* its window holds the logging window while the loop runs */
    char *config_text;        /* config_print of cfg: config.yaml, each checkpoint's run_config.yaml */
    uint32_t data_crc;        /* dataset_crc32 of the training data */
    long long last_saved;     /* step of the newest checkpoint this run saved or resumed from; 0 if none */
    FILE *trace;              /* CTUNE_TRACE: the documents of every step, for HF parity runs */
    ct_dist_env env;          /* this process's rank among those of the run (world 1: alone) */
    ct_dist *dist;            /* the ranks, once joined (train_run only) */
    FILE *notes;              /* notes on the checkpoint found and a resumed config: stderr on rank 0 */
    int fault_rank, fault_step; /* CTUNE_INJECT_RANK_FAULT (hooks.h); fault_step 0: none */
    bool fault_hang;
} run;

/* Rank 0 writes metrics, checkpoints and notes; the other ranks only compute. */
static bool lead(const run *r) { return r->env.rank == 0; }

/* Whether this process computes micro-batch i of a step (dist.h: dealt over the ranks). */
static bool owns(const run *r, size_t i) { return !r->dist || dist_owns(r->dist, i); }

ct_backend *train_backend(const ct_config *cfg, int gpu, ct_error *err)
{
    if (cfg->device == CT_DEVICE_CPU) return backend_cpu_new();
    ct_error why = {0};
    ct_cuda_options opt = {.device = gpu};
    ct_backend *be = backend_cuda_new_with(&opt, &why);
    if (be) return be;
    if (cfg->device == CT_DEVICE_CUDA) {
        CT_FAIL_RUNTIME(err, "device: cuda was asked for but no GPU is usable: %s", why.msg);
        return NULL;
    }
    fprintf(stderr, "note: no GPU (%s); running on the CPU reference backend\n", why.msg);
    return backend_cpu_new();
}

static void run_free(run *r)
{
    if (r->loader) loader_stop(r->loader);
    packer_free(r->packer);
    packer_free(r->eval_packer);
    graph_free(r->graph);
    if (r->be) {
        if (r->lora.params) lora_free(&r->lora, r->be);
        optim_guard_free(&r->guard, r->be);
        model_free(&r->model);
    }
    if (r->train_ds.shards) dataset_close(&r->train_ds);
    if (r->eval_ds.shards) dataset_close(&r->eval_ds);
    log_close(&r->log);
    if (r->trace) fclose(r->trace);
    if (r->notes && r->notes != stderr) fclose(r->notes);
    free(r->config_text);
    if (r->be) r->be->destroy(r->be);
}

static ct_packer_options packer_options(const ct_config *cfg)
{
    return (ct_packer_options){.tokens_per_micro_batch = cfg->data.tokens_per_micro_batch,
                               .max_length = cfg->data.max_length,
                               .packing = cfg->data.packing,
                               .shuffle_window = cfg->data.shuffle_window,
                               .seed = (uint64_t)cfg->training.seed};
}

/* Most tokens one micro-batch holds: with packing off a document is cut to
 * max_length (and never exceeds tokens_per_micro_batch, the packer's bound). */
static int capacity_of(const ct_config *cfg)
{
    int tpmb = cfg->data.tokens_per_micro_batch;
    return cfg->data.packing || cfg->data.max_length > tpmb ? tpmb : cfg->data.max_length;
}

/* Tokens of a document the packer keeps: max_length, and with packing off
 * never more than one micro-batch. */
static size_t doc_cap(const ct_packer_options *opt)
{
    return (size_t)(!opt->packing && opt->tokens_per_micro_batch < opt->max_length ? opt->tokens_per_micro_batch
                                                                                  : opt->max_length);
}

/* A shard none of whose documents has a target token (every label masked, or
 * max_length too short to predict one) would train with a loss of 0 and a
 * gradient of 0, or evaluate to NaN: CT_ERR_INPUT naming the first such shard. */
static int check_targets(const ct_dataset *ds, const ct_packer_options *opt, const char *key, ct_error *err)
{
    size_t cap = doc_cap(opt);
    for (int s = 0; s < ds->n_shards; s++) {
        bool found = false;
        for (size_t d = ds->doc_base[s]; d < ds->doc_base[s + 1] && !found; d++) {
            size_t len;
            const uint8_t *mask;
            dataset_doc(ds, d, &len, &mask);
            if (len > cap) len = cap;
            for (size_t j = 1; j < len && !found; j++) found = mask[j]; /* token j is predicted from j - 1 */
        }
        if (found) continue;
        const shard *sh = ds->shards[s];
        if (shard_num_labels(sh) == 0)
            return CT_FAIL_INPUT(err, "%s: no target tokens: the loss mask of all %zu documents is 0, so %s would "
                                 "train or evaluate on nothing (expected tokens with loss_mask 1, e.g. the "
                                 "assistant's turns)", shard_path(sh), shard_num_docs(sh), key);
        return CT_FAIL_INPUT(err, "%s: no target tokens within data.max_length %d: every label is a document's first "
                             "token or lies beyond it, so %s would train or evaluate on nothing (expected "
                             "data.max_length >= 2 and labels after each document's first token)",
                             shard_path(sh), (int)cap, key);
    }
    return CT_OK;
}

/* transformers' dynamic rope (dynamic NTK) rescales rope_theta for a sequence
 * longer than max_position_embeddings, and keeps the rescaled table for later
 * batches until a shorter one comes: not a function of the document. ctune
 * keeps the plain rope, equal to HF within max_position_embeddings, so a
 * longer document is CT_ERR_INPUT naming the shard. */
static int check_positions(const ct_dataset *ds, const ct_packer_options *opt, const ct_model_config *mc,
                           const char *key, ct_error *err)
{
    if (mc->rope.type != CT_ROPE_DYNAMIC) return CT_OK;
    size_t cap = doc_cap(opt);
    for (int s = 0; s < ds->n_shards; s++)
        for (size_t d = ds->doc_base[s]; d < ds->doc_base[s + 1]; d++) {
            size_t len;
            dataset_doc(ds, d, &len, NULL);
            if (len > cap) len = cap;
            if (len > (size_t)mc->max_position_embeddings)
                return CT_FAIL_INPUT(err, "%s: document %zu has %zu tokens, more than max_position_embeddings %d of a "
                                     "model with rope_type dynamic, whose rope transformers rescales past that length "
                                     "(expected data.max_length <= %d for %s)", shard_path(ds->shards[s]),
                                     d - ds->doc_base[s], len, mc->max_position_embeddings,
                                     mc->max_position_embeddings, key);
        }
    return CT_OK;
}

/* Opens model, data, adapter and graph (everything but the run directory). */
static int run_setup(run *r, const ct_config *cfg, bool need_train, ct_error *err)
{
    r->cfg = cfg;
    if (!(r->be = train_backend(cfg, r->env.local_rank, err))) return err->code;
    ct_load_options lopt = {.fp8 = cfg->base_precision == CT_BASE_FP8,
                            .quantize = cfg->model_quantization != CT_MODEL_QUANT_NONE,
                            .type = cfg->model_quantization == CT_MODEL_QUANT_FP4 ? QUANT4_FP4 : QUANT4_NF4,
                            .blocksize = 64, .double_quant = cfg->bnb_4bit_use_double_quant};
    int rc = model_load_with(&r->model, r->be, cfg->model, &lopt, err);
    if (rc) return rc;
    uint32_t V = (uint32_t)r->model.cfg.vocab_size;
    const char *train_pat[CT_MAX_FILES], *eval_pat[CT_MAX_FILES];
    for (int i = 0; i < cfg->data.n_train_files; i++) train_pat[i] = cfg->data.train_files[i];
    for (int i = 0; i < cfg->data.n_eval_files; i++) eval_pat[i] = cfg->data.eval_files[i];
    ct_packer_options opt = packer_options(cfg);
    if (need_train) {
        rc = dataset_open(&r->train_ds, train_pat, cfg->data.n_train_files, V, err);
        if (!rc && !(r->packer = packer_new(&r->train_ds, &opt, err))) rc = err->code;
        if (!rc) rc = check_targets(&r->train_ds, &opt, "data.train_files", err);
        if (!rc) rc = check_positions(&r->train_ds, &opt, &r->model.cfg, "data.train_files", err);
        if (rc) return rc;
    }
    if (cfg->data.n_eval_files > 0) {
        rc = dataset_open(&r->eval_ds, eval_pat, cfg->data.n_eval_files, V, err);
        if (!rc && !(r->eval_packer = packer_new(&r->eval_ds, &opt, err))) rc = err->code;
        if (!rc) rc = check_targets(&r->eval_ds, &opt, "data.eval_files", err);
        if (!rc) rc = check_positions(&r->eval_ds, &opt, &r->model.cfg, "data.eval_files", err);
        if (rc) return rc;
        r->has_eval = true;
    }
    /* adapters PEFT could not load whole are refused before anything trains */
    rc = adapter_check_peft(&r->model.cfg, &cfg->lora, err);
    if (!rc) rc = lora_init(&r->lora, &r->model, &cfg->lora, (uint64_t)cfg->training.seed, err);
    if (rc) return rc;
    if ((rc = optim_guard_init(&r->guard, r->be, &cfg->training, err))) return rc;
    ct_memory_plan plan;
    rc = memory_plan_make(&r->model, &r->lora, &cfg->memory, capacity_of(cfg), &plan, err);
    if (need_train && plan.opt.capacity > 0 && lead(r)) memory_plan_print(&plan, stdout);
    if (rc) return rc;
    if (r->be->reserve_scratch && !r->be->reserve_scratch(r->be, plan.workspace))
        return CT_FAIL_RUNTIME(err, "out of %s memory for the %.2f GiB op workspace the memory plan reserves",
                               r->be->name, (double)plan.workspace / (1 << 30));
    r->graph = graph_new_with(&r->model, &plan.opt, err);
    if (!r->graph) return err->code;
    if (plan.opt.offload_layers > 0 && !graph_host_pinned(r->graph))
        fprintf(stderr, "warning: page-locked host memory for offloaded activations could not be had; using "
                        "pageable memory (copies are slower and do not overlap compute)\n");
    return need_train && cfg->training.router_aux_loss ? graph_set_router_aux_loss(r->graph, true, err) : CT_OK;
}

/* *loss = the mean loss over one pass of the packer's epoch 0 (no dropout),
 * its micro-batches dealt over the ranks like a step's. */
static int evaluate(run *r, ct_packer *p, const ct_lora *lo, double *loss, int *targets_out, ct_error *err)
{
    ct_backend *be = r->be;
    ct_batch b;
    batch_alloc(&b, r->cfg->data.tokens_per_micro_batch); /* the packer fills up to this bound */
    size_t n = packer_batches_per_epoch(p);
    packer_seek(p, (ct_data_pos){0});
    be->zero(be, graph_loss_sum(r->graph), sizeof(float));
    long long targets = 0;
    for (size_t i = 0; i < n; i++) {
        packer_next(p, &b);
        targets += b.n_targets;
        if (!owns(r, i)) continue;
        graph_set_batch(r->graph, &b);
        graph_eval(r->graph, lo);
        dist_beat(r->dist);
    }
    float sum = 0;
    be->download(be, &sum, graph_loss_sum(r->graph), sizeof sum);
    be->zero(be, graph_loss_sum(r->graph), sizeof(float));
    batch_free(&b);
    int rc = r->dist ? dist_sum_host(r->dist, &sum, 1, err) : CT_OK;
    *targets_out = (int)targets;
    *loss = targets > 0 ? sum / (double)targets : NAN;
    return rc;
}

/* Every rank takes part (the window's loss is summed over them); rank 0 writes. */
static int save_checkpoint(run *r, ct_error *err)
{
    ct_backend *be = r->be;
    r->state.total_steps = r->total_steps;
    r->state.data = loader_position(r->loader);
    r->state.data_crc32 = r->data_crc;
    float sums[2];
    be->download(be, &sums[0], graph_loss_sum(r->graph), sizeof(float));
    be->download(be, &sums[1], graph_aux_loss_sum(r->graph), sizeof(float));
    int rc = r->dist ? dist_sum_host(r->dist, sums, 2, err) : CT_OK;
    if (rc) return rc;
    r->state.window.loss_sum = sums[0];
    r->state.window.aux_sum = sums[1];
    optim_guard_save(&r->guard, be, &r->state.guard);
    if (lead(r)) {
        dist_beat(r->dist);
        rc = checkpoint_save(r->cfg->output_dir, &r->lora, &r->model, &r->state, r->config_text, r->cfg->model,
                             r->cfg->training.save_total_limit, err);
        if (rc) return rc;
        log_plot(&r->log);
    }
    r->last_saved = r->state.step;
    return CT_OK;
}

static char *print_config(const ct_config *cfg)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    config_print(cfg, f);
    fclose(f);
    return buf;
}

/* output_dir/config.yaml is the config the run began with: a resumed run never
 * overwrites it, and writes its own beside it (config.resume-STEP.yaml) when
 * it differs. */
static int write_resolved_config(const run *r, bool resumed, ct_error *err)
{
    char path[CT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/config.yaml", r->cfg->output_dir);
    size_t n = strlen(r->config_text);
    if (resumed) {
        size_t len;
        ct_error missing = {0};
        char *first = ct_read_file_max(path, CT_CONFIG_MAX_BYTES, &len, &missing);
        bool same = first && len == n && !memcmp(first, r->config_text, n);
        if (first)
            snprintf(path, sizeof path, "%s/config.resume-%lld.yaml", r->cfg->output_dir, (long long)r->state.step);
        free(first);
        if (same) return CT_OK;
    }
    return ct_write_file_atomic(path, r->config_text, n, err);
}

/* Compares the config with the one the checkpoint's run had: its
 * run_config.yaml, or for a checkpoint older than that, the config.yaml of
 * the run folder it is in. */
static int check_config(const run *r, const char *ckpt, const ct_trainer_state *st, ct_error *err)
{
    char file[CT_PATH_MAX + 96];
    snprintf(file, sizeof file, "%s/run_config.yaml", ckpt);
    size_t len;
    ct_error missing = {0};
    char *saved = ct_read_file_max(file, CT_CONFIG_MAX_BYTES, &len, &missing);
    if (!saved) {
        const char *slash = strrchr(ckpt, '/');
        snprintf(file, sizeof file, "%.*s/config.yaml", slash ? (int)(slash - ckpt) : 1, slash ? ckpt : ".");
        saved = ct_read_file_max(file, CT_CONFIG_MAX_BYTES, &len, &missing);
    }
    ct_resume_facts f = {.checkpoint = ckpt, .saved_config = saved, .saved_from = file,
                         .saved_total_steps = st->total_steps, .total_steps = r->total_steps,
                         .has_data_crc = st->has_run_state, .saved_data_crc = st->data_crc32,
                         .data_crc = r->data_crc};
    int rc = resume_check(r->cfg, r->config_text, &f, r->notes, err);
    free(saved);
    return rc;
}

/* Resumes from the checkpoint the config names (if any), then cuts
 * metrics.jsonl back to its step and writes the resolved config. */
static int resume_if_asked(run *r, ct_error *err)
{
    const ct_config *cfg = r->cfg;
    const ct_training_config *t = &cfg->training;
    char path[CT_PATH_MAX + 64];
    bool found = false;
    int rc = CT_OK;
    if (t->resume_mode == CT_RESUME_PATH) {
        snprintf(path, sizeof path, "%s", t->resume_from_checkpoint);
        found = true;
    } else if (t->resume_mode == CT_RESUME_AUTO) {
        found = checkpoint_find_latest(cfg->output_dir, path, sizeof path, r->notes);
    }
    if (found) {
        ct_trainer_state st;
        rc = checkpoint_read_state(path, &st, err);
        if (rc && t->resume_mode == CT_RESUME_PATH) {
            char why[sizeof err->msg];
            snprintf(why, sizeof why, "%s", err->msg);
            ct_fail(err, rc, "training.resume_from_checkpoint: %s", why);
        }
        if (!rc) rc = check_config(r, path, &st, err);
        if (!rc) rc = checkpoint_load_weights(path, &r->lora, &r->model, err);
        if (!rc) rc = packer_check_position(r->packer, st.data, err);
        if (rc) return rc;
        r->state = st;
        r->last_saved = st.step;
        packer_seek(r->packer, st.data);
        optim_guard_restore(&r->guard, r->be, &st.guard);
        log_note(&r->log, "resumed from %s (step %lld)", path, (long long)st.step);
    }
    if (!lead(r)) { /* rank 0 carries the saved window's loss; the output folder is its to write */
        r->state.window.loss_sum = r->state.window.aux_sum = 0;
        return CT_OK;
    }
    char metrics[CT_PATH_MAX + 32];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", cfg->output_dir);
    rc = metrics_truncate(metrics, (long long)r->state.step, err);
    return rc ? rc : write_resolved_config(r, found, err);
}

/* CTUNE_TRACE=DIR (hooks.h; a debugging aid for scripts/hf_parity.py): writes the adapter
 * as it is before step 1 to DIR/initial_adapter and, per optimizer step, the
 * documents of each micro-batch as [global doc id, tokens used] to DIR/batches.jsonl. */
static int trace_open(run *r, ct_error *err)
{
    const char *dir = hooks_get()->trace_dir;
    if (!dir) return CT_OK;
    char path[CT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/initial_adapter", dir);
    int rc = ct_mkdirs(dir, err);
    if (!rc && r->state.step == 0) rc = lora_save_peft(&r->lora, &r->model, path, r->cfg->model, err);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/batches.jsonl", dir);
    if (!(r->trace = fopen(path, "a"))) return CT_FAIL_RUNTIME(err, "%s: cannot open for writing", path);
    return CT_OK;
}

static void trace_step(run *r, int step, const ct_batch *const *batches, int n)
{
    fprintf(r->trace, "{\"step\": %d, \"micro_batches\": [", step);
    for (int i = 0; i < n; i++) {
        const ct_batch *b = batches[i];
        fprintf(r->trace, "%s[", i ? ", " : "");
        for (int d = 0; d < b->n_docs; d++)
            fprintf(r->trace, "%s[%lld, %d]", d ? ", " : "", (long long)b->doc_ids[d],
                    b->cu_seqlens[d + 1] - b->cu_seqlens[d]);
        fprintf(r->trace, "]");
    }
    fprintf(r->trace, "]}\n");
    fflush(r->trace);
}

/* The update of step `bad` left a LoRA weight non-finite (the guard read it
 * at `step`): nothing after the last good checkpoint may be saved. */
static int weights_fail(const run *r, int step, int bad, ct_error *err)
{
    char good[CT_PATH_MAX + 64] = "no checkpoint was saved before it: start again";
    if (r->last_saved > 0)
        snprintf(good, sizeof good, "%s/checkpoint-%lld holds the last good state: rerun to resume from it",
                 r->cfg->output_dir, r->last_saved);
    return CT_FAIL_RUNTIME(err, "training stopped at step %d: the optimizer update of step %d left non-finite LoRA "
                           "weights (its gradient was finite: the update overflowed fp32); nothing after it was saved "
                           "and %s (HINT: lower training.learning_rate or training.weight_decay first)",
                           step, bad, good);
}

/* CTUNE_INJECT_RANK_FAULT=RANK:STEP:exit|hang (hooks.h), for the tests of a rank that dies or hangs. */
static int parse_rank_fault(run *r, ct_error *err)
{
    const char *v = hooks_get()->inject_rank_fault;
    if (!v) return CT_OK;
    char how[8] = "";
    int n = 0;
    if (sscanf(v, "%d:%d:%7[a-z]%n", &r->fault_rank, &r->fault_step, how, &n) != 3 || v[n] || r->fault_step < 1 ||
        (strcmp(how, "exit") && strcmp(how, "hang")))
        return CT_FAIL_INPUT(err, "CTUNE_INJECT_RANK_FAULT=%s: expected RANK:STEP:exit or RANK:STEP:hang", v);
    r->fault_hang = !strcmp(how, "hang");
    return CT_OK;
}

static void rank_fault(const run *r, int step)
{
    if (r->fault_step != step || r->fault_rank != r->env.rank) return;
    fprintf(stderr, "rank %d: CTUNE_INJECT_RANK_FAULT: %s at step %d\n", r->env.rank,
            r->fault_hang ? "hanging" : "exiting", step);
    if (!r->fault_hang) exit(3);
    for (;;) sleep(3600);
}

static int train_loop(run *r, ct_error *err)
{
    const ct_config *cfg = r->cfg;
    const ct_training_config *t = &cfg->training;
    ct_backend *be = r->be;
    int ga = t->gradient_accumulation_steps;
    const ct_batch **batches = ct_calloc(ga, sizeof *batches);
    /* What was summed since the last record; a resumed run starts from the checkpoint's. */
    ct_log_window *w = &r->state.window;
    double t_start = ct_now(), elapsed0 = r->state.elapsed;
    double timed_tokens = 0, window_t0 = t_start; /* tokens/s counts this process's steps only */
    float *loss_sum = graph_loss_sum(r->graph), *aux_sum = graph_aux_loss_sum(r->graph);
    be->upload(be, loss_sum, &w->loss_sum, sizeof(float));
    be->upload(be, aux_sum, &w->aux_sum, sizeof(float));
    int rc = CT_OK;
    uint64_t step_syncs = 0; /* host waits inside steps, not counting logging reads */
    int stop_sig = 0;        /* the signal that stopped the run after a step, on any rank */
    int steps_run = 0;
    for (int step = (int)r->state.step + 1; step <= r->total_steps && !rc; step++) {
        long long targets = 0, tokens = 0;
        uint64_t syncs0 = be->host_syncs;
        for (int i = 0; i < ga; i++) {
            batches[i] = loader_next(r->loader);
            targets += batches[i]->n_targets;
            tokens += batches[i]->n_tokens;
        }
        if (r->trace) trace_step(r, step, batches, ga);
        be->zero(be, r->lora.grads, r->lora.n_params * sizeof(float));
        float grad_scale = targets > 0 ? 1.0f / (float)targets : 0.0f;
        for (int i = 0; i < ga; i++) {
            if (owns(r, i)) {
                graph_set_batch(r->graph, batches[i]);
                graph_train_step(r->graph, &r->lora, grad_scale,
                                 ct_hash64((uint64_t)t->seed, (uint64_t)step * ga + i));
                dist_beat(r->dist);
            }
            loader_release(r->loader, batches[i]);
        }
        rank_fault(r, step);
        if (r->dist && (rc = dist_sum_device(r->dist, be, r->lora.grads, r->lora.n_params, err))) break;
        double lr = optim_lr(t, step, r->total_steps);
        optim_guard_inject(&r->guard, be, r->lora.grads, step);
        optim_step(be, &r->lora, t, optim_guard_slot(&r->guard, step), lr, step);
        optim_guard_watch(&r->guard, be, &r->lora);
        step_syncs += be->host_syncs - syncs0;
        steps_run++;
        r->state.step = step;
        r->state.tokens_seen += (double)tokens;
        w->targets += (double)targets;
        w->tokens += (double)tokens;
        w->micro_batches += ga;
        timed_tokens += (double)tokens;

        bool last = step == r->total_steps, log_now = step % t->logging_steps == 0 || last;
        if (log_now || optim_guard_full(&r->guard)) optim_guard_read(&r->guard, be);
        int bad_weights = r->guard.bad_weights_step;
        bool nonfinite_stop = optim_guard_tripped(&r->guard) || bad_weights;
        if (log_now || nonfinite_stop) {
            float sums[2] = {0, 0}; /* this rank's loss and aux sums, then the run's */
            be->download(be, &sums[0], loss_sum, sizeof(float));
            be->zero(be, loss_sum, sizeof(float));
            if (cfg->training.router_aux_loss) {
                be->download(be, &sums[1], aux_sum, sizeof(float));
                be->zero(be, aux_sum, sizeof(float));
            }
            if (r->dist && (rc = dist_sum_host(r->dist, sums, 2, err))) break;
            float sum = sums[0];
            double aux = cfg->training.router_aux_loss
                             ? sums[1] / (w->micro_batches > 0 ? (double)w->micro_batches : 1) : NAN;
            double now = ct_now();
            ct_train_record rec = {.step = step, .total_steps = r->total_steps,
                                   .loss = (w->loss + sum) / (w->targets > 0 ? w->targets : 1),
                                   .lr = lr, .grad_norm = sqrt(r->guard.last_norm_sq), .tokens = r->state.tokens_seen,
                                   .skipped_steps = r->guard.skipped_since_log, .aux_loss = aux,
                                   .tokens_per_second = timed_tokens / (now - window_t0),
                                   .elapsed = elapsed0 + now - t_start,
                                   .memory_used = be->memory_used ? be->memory_used(be) : 0};
            log_train(&r->log, &rec);
            r->guard.skipped_since_log = 0;
            w->loss = w->targets = w->tokens = 0;
            w->micro_batches = 0;
            timed_tokens = 0;
            window_t0 = now;
        }
        if (bad_weights) {
            rc = weights_fail(r, step, bad_weights, err);
            break;
        }
        if (r->has_eval && t->eval_steps > 0 && (step % t->eval_steps == 0 || last)) {
            float partial = 0; /* the training window's loss so far survives the eval */
            be->download(be, &partial, loss_sum, sizeof partial);
            if (r->dist && (rc = dist_sum_host(r->dist, &partial, 1, err))) break;
            w->loss += partial;
            int n;
            double el;
            if ((rc = evaluate(r, r->eval_packer, &r->lora, &el, &n, err))) break;
            log_eval(&r->log, step, el, n);
        }
        r->state.elapsed = elapsed0 + ct_now() - t_start;
        if ((t->save_steps > 0 && step % t->save_steps == 0 && !last) || nonfinite_stop) rc = save_checkpoint(r, err);
        if (nonfinite_stop && !rc)
            rc = CT_FAIL_RUNTIME(err, "training stopped at step %d: %d steps in a row (from step %d) had a non-finite "
                                 "loss or gradient and were skipped (training.max_nonfinite_steps: %d); checkpoint-%d "
                                 "holds the weights from before them (HINT: lower training.learning_rate or set "
                                 "training.max_grad_norm, check the data of those steps, then rerun to resume)",
                                 step, r->guard.streak, r->guard.streak_start, t->max_nonfinite_steps, step);
        /* SIGINT/SIGTERM on any rank: the step is done; every rank saves below and stops */
        if (!rc) rc = r->dist ? dist_agree(r->dist, step, interrupt_pending(), &stop_sig, err)
                              : (stop_sig = interrupt_pending(), CT_OK);
        if (stop_sig) break;
    }
    free(batches);
    bool interrupted = r->state.step < r->total_steps && stop_sig;
    if (rc) return rc;
    if (steps_run > 0)
        log_note(&r->log, "host syncs per step: %.2f (the loss is read back on logging steps only)",
                 (double)step_syncs / steps_run);
    if (r->state.step > 0) rc = save_checkpoint(r, err);
    if (rc) return rc;
    if (interrupted) return interrupt_fail(err, stop_sig, cfg->output_dir, (long long)r->state.step);
    if (!lead(r)) return CT_OK;
    char final[CT_PATH_MAX + 16];
    snprintf(final, sizeof final, "%s/final", cfg->output_dir);
    rc = lora_save_peft(&r->lora, &r->model, final, cfg->model, err);
    if (!rc) log_note(&r->log, "done: %lld steps, adapter in %s", (long long)r->state.step, final);
    return rc;
}

int train_check_ranks(const ct_config *cfg, int world, ct_error *err)
{
    int ga = cfg->training.gradient_accumulation_steps;
    if (ga >= world) return CT_OK;
    return CT_FAIL_INPUT(err, "%s: training.gradient_accumulation_steps is %d but the run has %d ranks: a step's "
                         "micro-batches are dealt over the ranks, so rank %d would have none (expected at least %d, "
                         "best a multiple of %d)", cfg->source_path[0] ? cfg->source_path : "config", ga, world, ga,
                         world, world);
}

static int train_ranks(run *r, const ct_config *cfg, ct_error *err)
{
    int rc = parse_rank_fault(r, err);
    if (rc) return rc;
    if (!(r->dist = dist_open(&r->env, r->be, cfg->distributed.timeout_seconds, hooks_get()->dist_host_reduce, err)))
        return err->code;
    if (r->env.world > 1)
        log_note(&r->log, "ranks: %d (%s), launched by %s; the %d micro-batches of a step are dealt over them, %s",
                 r->env.world, r->be->name, r->env.launcher, cfg->training.gradient_accumulation_steps,
                 dist_describe(r->dist));
    if (lead(r)) rc = checkpoint_check_space(cfg->output_dir, &r->lora, err);
    return rc;
}

int train_run(const ct_config *cfg, ct_error *err)
{
    run r = {0};
    int rc = dist_env_read(&r.env, err);
    r.log.quiet = !lead(&r);
    r.notes = lead(&r) ? stderr : fopen("/dev/null", "w");
    if (!rc && !r.notes) rc = CT_FAIL_RUNTIME(err, "/dev/null: cannot open for writing");
    if (!rc) rc = train_check_ranks(cfg, r.env.world, err);
    if (!rc && lead(&r)) rc = checkpoint_probe_dir(cfg->output_dir, err);
    if (!rc && lead(&r)) checkpoint_clean_stale(cfg->output_dir, stderr);
    if (!rc) rc = run_setup(&r, cfg, true, err);
    if (!rc) rc = train_ranks(&r, cfg, err);
    if (!rc) rc = config_total_steps(cfg, packer_batches_per_epoch(r.packer), &r.total_steps, err);
    if (!rc) {
        r.config_text = print_config(cfg);
        r.data_crc = dataset_crc32(&r.train_ds);
        ct_packer_stats s = packer_epoch_stats(r.packer, 0);
        log_note(&r.log, "ctune: %s backend, model %s (%s, %d layers), %zu LoRA parameters, %d steps",
                 r.be->name, cfg->model, r.model.cfg.model_type, r.model.cfg.num_hidden_layers, r.lora.n_params,
                 r.total_steps);
        if (r.model.quant_weights)
            log_note(&r.log, "base: %.3g G weights held in 4 bits (%s), decoded per GEMM", r.model.quant_weights / 1e9,
                     cfg->model_quantization == CT_MODEL_QUANT_FP4 ? "fp4, quantized on load"
                     : cfg->model_quantization == CT_MODEL_QUANT_NF4 ? "nf4, quantized on load" : "as stored");
        if (r.model.fp8_weights)
            log_note(&r.log, "base: %.3g G weights held in FP8 (E4M3, 128x128 blocks, %s), %s",
                     r.model.fp8_weights / 1e9, cfg->base_precision == CT_BASE_FP8 ? "quantized on load" : "as stored",
                     r.be->linear_fwd_fp8 ? "multiplied by FP8 GEMMs" : "decoded per GEMM");
        log_note(&r.log, "data: %zu documents, %zu tokens, %zu micro-batches per epoch, packing efficiency %.1f%%, "
                 "%zu documents truncated to %d tokens",
                 s.docs, s.tokens, s.batches, 100.0 * s.efficiency, s.truncated_docs, cfg->data.max_length);
        rc = resume_if_asked(&r, err);
    }
    /* metrics.jsonl is opened for appending only once resume has cut it back to the checkpoint */
    if (!rc && lead(&r)) rc = log_open(&r.log, cfg->output_dir, err);
    if (!rc && lead(&r)) rc = trace_open(&r, err);
    if (!rc) {
        r.loader = loader_start(r.packer, 2 * cfg->training.gradient_accumulation_steps + 2);
        interrupt_install();
        rc = train_loop(&r, err);
        interrupt_restore();
    }
    char own[32];
    snprintf(own, sizeof own, "rank %d: ", r.env.rank);
    if (rc && r.env.world > 1 && strncmp(err->msg, own, strlen(own))) { /* say which rank it was */
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s%s", own, err->msg);
        snprintf(err->msg, sizeof err->msg, "%s", msg);
    }
    dist_close(r.dist, rc != 0);
    run_free(&r);
    return rc;
}

int train_dry_run(const ct_config *cfg, ct_error *err)
{
    run r = {0};
    int rc = run_setup(&r, cfg, true, err);
    if (!rc) printf("dry run: the plan fits; nothing was trained or written\n");
    r.log.metrics = NULL;
    run_free(&r);
    return rc;
}

int eval_run(const ct_config *cfg, const char *adapter_dir, ct_error *err)
{
    if (cfg->data.n_eval_files == 0)
        return CT_FAIL_INPUT(err, "%s: data.eval_files is empty: nothing to evaluate (expected shards to evaluate "
                             "on: data.eval_files in the config, or --set \"data.eval_files=[SHARD]\")",
                             cfg->source_path[0] ? cfg->source_path : "config");
    run r = {0};
    int rc = run_setup(&r, cfg, false, err);
    if (!rc && adapter_dir) { /* the adapter's own r and targets, not the config's lora section */
        lora_free(&r.lora, r.be);
        rc = adapter_load(&r.lora, &r.model, adapter_dir, err);
    }
    if (!rc) {
        int n;
        double loss;
        rc = evaluate(&r, r.eval_packer, adapter_dir ? &r.lora : NULL, &loss, &n, err);
        printf("eval: loss %.6f  perplexity %.4f  (%d target tokens, %s)\n", loss, exp(loss), n,
               adapter_dir ? adapter_dir : "base model");
    }
    r.log.metrics = NULL;
    run_free(&r);
    return rc;
}
