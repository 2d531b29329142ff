/* train.c — the training loop (see train.h). One optimizer step:
 *   take gradient_accumulation_steps micro-batches from the loader thread; their
 *   target count (known on the host) fixes grad_scale = 1 / targets, so the loss
 *   is the mean over the step's target tokens however the data is packed;
 *   forward + backward each; clip + AdamW on the backend. The loss and grad norm
 *   are read back only on logging steps. */
#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adapter.h"
#include "checkpoint.h"
#include "graph.h"
#include "interrupt.h"
#include "memory_plan.h"
#include "log.h"
#include "optim.h"

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
    ct_trainer_state state;
    FILE *trace;              /* CTUNE_TRACE: the documents of every step, for HF parity runs */
} run;

ct_backend *train_backend(const ct_config *cfg, ct_error *err)
{
    if (cfg->device == CT_DEVICE_CPU) return backend_cpu_new();
    ct_error why = {0};
    ct_backend *be = backend_cuda_new(&why);
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

/* Opens model, data, adapter and graph (everything but the run directory). */
static int run_setup(run *r, const ct_config *cfg, bool need_train, ct_error *err)
{
    r->cfg = cfg;
    if (!(r->be = train_backend(cfg, err))) return err->code;
    int rc = model_load(&r->model, r->be, cfg->model, err);
    if (rc) return rc;
    uint32_t V = (uint32_t)r->model.cfg.vocab_size;
    const char *train_pat[CT_MAX_FILES], *eval_pat[CT_MAX_FILES];
    for (int i = 0; i < cfg->data.n_train_files; i++) train_pat[i] = cfg->data.train_files[i];
    for (int i = 0; i < cfg->data.n_eval_files; i++) eval_pat[i] = cfg->data.eval_files[i];
    ct_packer_options opt = packer_options(cfg);
    if (need_train || cfg->data.n_eval_files == 0) {
        rc = dataset_open(&r->train_ds, train_pat, cfg->data.n_train_files, V, err);
        if (!rc && !(r->packer = packer_new(&r->train_ds, &opt, err))) rc = err->code;
        if (rc) return rc;
    }
    if (cfg->data.n_eval_files > 0) {
        rc = dataset_open(&r->eval_ds, eval_pat, cfg->data.n_eval_files, V, err);
        if (!rc && !(r->eval_packer = packer_new(&r->eval_ds, &opt, err))) rc = err->code;
        if (rc) return rc;
        r->has_eval = true;
    }
    rc = lora_init(&r->lora, &r->model, &cfg->lora, (uint64_t)cfg->training.seed, err);
    if (rc) return rc;
    if ((rc = optim_guard_init(&r->guard, r->be, &cfg->training, err))) return rc;
    ct_memory_plan plan;
    rc = memory_plan_make(&r->model, &r->lora, &cfg->memory, capacity_of(cfg), &plan, err);
    if (need_train && plan.opt.capacity > 0) memory_plan_print(&plan, stdout);
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

/* Mean loss over one pass of the packer's epoch 0 (no dropout). */
static double evaluate(run *r, ct_packer *p, const ct_lora *lo, int *targets_out)
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
        graph_set_batch(r->graph, &b);
        graph_eval(r->graph, lo);
        targets += b.n_targets;
    }
    float sum = 0;
    be->download(be, &sum, graph_loss_sum(r->graph), sizeof sum);
    be->zero(be, graph_loss_sum(r->graph), sizeof(float));
    batch_free(&b);
    *targets_out = (int)targets;
    return targets > 0 ? sum / (double)targets : NAN;
}

static int save_checkpoint(run *r, ct_error *err)
{
    r->state.total_steps = r->total_steps;
    r->state.data = loader_position(r->loader);
    int rc = checkpoint_save(r->cfg->output_dir, &r->lora, &r->model, &r->state, r->cfg->model,
                             r->cfg->training.save_total_limit, err);
    if (!rc) log_plot(&r->log);
    return rc;
}

static int write_resolved_config(const ct_config *cfg, ct_error *err)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    config_print(cfg, f);
    fclose(f);
    char path[CT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.yaml", cfg->output_dir);
    int rc = ct_write_file_atomic(path, buf, len, err);
    free(buf);
    return rc;
}

static int resume_if_asked(run *r, ct_error *err)
{
    const ct_training_config *t = &r->cfg->training;
    char path[CT_PATH_MAX + 64];
    if (t->resume_mode == CT_RESUME_FALSE) return CT_OK;
    if (t->resume_mode == CT_RESUME_PATH) snprintf(path, sizeof path, "%s", t->resume_from_checkpoint);
    else if (!checkpoint_find_latest(r->cfg->output_dir, path, sizeof path, stderr)) return CT_OK;
    int rc = checkpoint_load(path, &r->lora, &r->model, &r->state, err);
    if (!rc) rc = packer_check_position(r->packer, r->state.data, err);
    if (rc) return rc;
    packer_seek(r->packer, r->state.data);
    log_note(&r->log, "resumed from %s (step %lld)", path, (long long)r->state.step);
    return CT_OK;
}

/* CTUNE_TRACE=DIR (a debugging aid for scripts/hf_parity.py): writes the adapter
 * as it is before step 1 to DIR/initial_adapter and, per optimizer step, the
 * documents of each micro-batch as [global doc id, tokens used] to DIR/batches.jsonl. */
static int trace_open(run *r, ct_error *err)
{
    const char *dir = getenv("CTUNE_TRACE");
    if (!dir || !*dir) return CT_OK;
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

static int train_loop(run *r, ct_error *err)
{
    const ct_config *cfg = r->cfg;
    const ct_training_config *t = &cfg->training;
    ct_backend *be = r->be;
    int ga = t->gradient_accumulation_steps;
    const ct_batch **batches = ct_calloc(ga, sizeof *batches);
    double window_loss = 0, window_targets = 0, t_start = ct_now(), elapsed0 = r->state.elapsed;
    double window_tokens = 0, window_t0 = t_start;
    float *loss_sum = graph_loss_sum(r->graph), *aux_sum = graph_aux_loss_sum(r->graph);
    be->zero(be, loss_sum, sizeof(float));
    be->zero(be, aux_sum, sizeof(float));
    int window_micro = 0; /* micro-batches since the last record: the aux loss is per micro-batch */
    int rc = CT_OK;
    uint64_t step_syncs = 0; /* host waits inside steps, not counting logging reads */
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
            graph_set_batch(r->graph, batches[i]);
            graph_train_step(r->graph, &r->lora, grad_scale, ct_hash64((uint64_t)t->seed, (uint64_t)step * ga + i));
            loader_release(r->loader, batches[i]);
        }
        double lr = optim_lr(t, step, r->total_steps);
        optim_guard_inject(&r->guard, be, r->lora.grads, step);
        optim_step(be, &r->lora, t, optim_guard_slot(&r->guard, step), lr, step);
        step_syncs += be->host_syncs - syncs0;
        steps_run++;
        r->state.step = step;
        r->state.tokens_seen += (double)tokens;
        window_targets += (double)targets;
        window_tokens += (double)tokens;
        window_micro += ga;

        bool last = step == r->total_steps, log_now = step % t->logging_steps == 0 || last;
        if (log_now || optim_guard_full(&r->guard)) optim_guard_read(&r->guard, be);
        bool nonfinite_stop = optim_guard_tripped(&r->guard);
        if (log_now || nonfinite_stop) {
            float sum = 0;
            be->download(be, &sum, loss_sum, sizeof sum);
            be->zero(be, loss_sum, sizeof(float));
            double aux = NAN;
            if (cfg->training.router_aux_loss) {
                float a = 0;
                be->download(be, &a, aux_sum, sizeof a);
                be->zero(be, aux_sum, sizeof(float));
                aux = a / (window_micro > 0 ? window_micro : 1);
            }
            double now = ct_now();
            ct_train_record rec = {.step = step, .total_steps = r->total_steps,
                                   .loss = (window_loss + sum) / (window_targets > 0 ? window_targets : 1),
                                   .lr = lr, .grad_norm = sqrt(r->guard.last_norm_sq), .tokens = r->state.tokens_seen,
                                   .skipped_steps = r->guard.skipped_since_log, .aux_loss = aux,
                                   .tokens_per_second = window_tokens / (now - window_t0),
                                   .elapsed = elapsed0 + now - t_start,
                                   .memory_used = be->memory_used ? be->memory_used(be) : 0};
            log_train(&r->log, &rec);
            r->guard.skipped_since_log = 0;
            window_loss = window_targets = window_tokens = 0;
            window_micro = 0;
            window_t0 = now;
        }
        if (r->has_eval && t->eval_steps > 0 && (step % t->eval_steps == 0 || last)) {
            float partial = 0; /* the training window's loss so far survives the eval */
            be->download(be, &partial, loss_sum, sizeof partial);
            window_loss += partial;
            int n;
            double el = evaluate(r, r->eval_packer, &r->lora, &n);
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
        if (interrupt_pending()) break; /* SIGINT/SIGTERM: the step is done; save below and stop */
    }
    free(batches);
    bool interrupted = r->state.step < r->total_steps && interrupt_pending();
    if (rc) return rc;
    if (steps_run > 0)
        log_note(&r->log, "host syncs per step: %.2f (the loss is read back on logging steps only)",
                 (double)step_syncs / steps_run);
    if (r->state.step > 0) rc = save_checkpoint(r, err);
    if (rc) return rc;
    if (interrupted) return interrupt_fail(err, cfg->output_dir, (long long)r->state.step);
    char final[CT_PATH_MAX + 16];
    snprintf(final, sizeof final, "%s/final", cfg->output_dir);
    rc = lora_save_peft(&r->lora, &r->model, final, cfg->model, err);
    if (!rc) log_note(&r->log, "done: %lld steps, adapter in %s", (long long)r->state.step, final);
    return rc;
}

int train_run(const ct_config *cfg, ct_error *err)
{
    run r = {0};
    int rc = checkpoint_probe_dir(cfg->output_dir, err);
    if (!rc) rc = log_open(&r.log, cfg->output_dir, err);
    if (!rc) rc = run_setup(&r, cfg, true, err);
    if (!rc) rc = checkpoint_check_space(cfg->output_dir, &r.lora, err);
    if (!rc) rc = write_resolved_config(cfg, err);
    if (!rc) {
        size_t per_epoch = packer_batches_per_epoch(r.packer);
        int ga = cfg->training.gradient_accumulation_steps;
        r.total_steps = cfg->training.max_steps > 0
                            ? cfg->training.max_steps
                            : (int)ceil(cfg->training.num_train_epochs * (double)per_epoch / ga);
        if (r.total_steps < 1) r.total_steps = 1;
        ct_packer_stats s = packer_epoch_stats(r.packer, 0);
        log_note(&r.log, "ctune: %s backend, model %s (%s, %d layers), %zu LoRA parameters, %d steps",
                 r.be->name, cfg->model, r.model.cfg.model_type, r.model.cfg.num_hidden_layers, r.lora.n_params,
                 r.total_steps);
        log_note(&r.log, "data: %zu documents, %zu tokens, %zu micro-batches per epoch, packing efficiency %.1f%%, "
                 "%zu documents truncated to %d tokens",
                 s.docs, s.tokens, s.batches, 100.0 * s.efficiency, s.truncated_docs, cfg->data.max_length);
        rc = resume_if_asked(&r, err);
        if (!rc) rc = trace_open(&r, err);
    }
    if (!rc) {
        r.loader = loader_start(r.packer, 2 * cfg->training.gradient_accumulation_steps + 2);
        interrupt_install();
        rc = train_loop(&r, err);
        interrupt_restore();
    }
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
    run r = {0};
    int rc = run_setup(&r, cfg, false, err);
    if (!rc && adapter_dir) { /* the adapter's own r and targets, not the config's lora section */
        lora_free(&r.lora, r.be);
        rc = adapter_load(&r.lora, &r.model, adapter_dir, err);
    }
    if (!rc) {
        int n;
        double loss = evaluate(&r, r.has_eval ? r.eval_packer : r.packer, adapter_dir ? &r.lora : NULL, &n);
        printf("eval: loss %.6f  perplexity %.4f  (%d target tokens, %s)\n", loss, exp(loss), n,
               adapter_dir ? adapter_dir : "base model");
    }
    r.log.metrics = NULL;
    run_free(&r);
    return rc;
}
