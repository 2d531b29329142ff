/* lora_step.h — one LoRA training step on the CPU backend for the tests that
 * compare how a base is held (test_qlora, test_fp8_base): a model folder
 * loaded with load options, LoRA r 4 on every module with B random (so dA is
 * tested too), two packed documents; the loss and the LoRA gradients. */
#ifndef CT_LORA_STEP_H
#define CT_LORA_STEP_H

#include <math.h>
#include <stdio.h>

#include "config.h"
#include "graph.h"
#include "model_fixture.h"

/* NAN (the error printed) when the folder does not load. *q4 and *fp8 (each
 * may be NULL) get the weights the model holds in 4 bits and in FP8. */
static double lora_step(const char *dir, const ct_load_options *opt, float **grads, size_t *n, size_t *q4,
                        size_t *fp8)
{
    ct_error err = {0};
    ct_backend *be = backend_cpu_new();
    ct_model m;
    if (model_load_with(&m, be, dir, opt, &err)) {
        printf("model_load: %s\n", err.msg);
        be->destroy(be);
        return NAN;
    }
    if (q4) *q4 = m.quant_weights;
    if (fp8) *fp8 = m.fp8_weights;
    static ct_config cfg; /* the defaults: all-linear */
    config_defaults(&cfg);
    ct_lora_config lc = cfg.lora;
    lc.r = 4;
    lc.lora_alpha = 8;
    ct_lora lo;
    if (lora_init(&lo, &m, &lc, 3, &err)) return printf("lora_init: %s\n", err.msg), NAN;
    float *p = ct_malloc(lo.n_params * sizeof(float));
    be->download(be, p, lo.params, lo.n_params * sizeof(float));
    ct_rng rng;
    ct_rng_seed(&rng, 11);
    for (size_t i = 0; i < lo.n_params; i++) p[i] += 0.05f * ct_rng_normal(&rng);
    be->upload(be, lo.params, p, lo.n_params * sizeof(float));
    free(p);
    static const int32_t a[] = {1, 5, 9, 2, 33, 17, 8, 60, 4}, b[] = {50, 22, 9, 13, 13, 2, 63};
    const int32_t *docs[] = {a, b};
    int lens[] = {9, 7};
    ct_batch batch;
    batch_alloc(&batch, 64);
    fixture_batch(&batch, docs, lens, 2);
    ct_graph *g = graph_new(&m, 64, true, &err);
    if (!g) return printf("graph_new: %s\n", err.msg), NAN;
    be->zero(be, lo.grads, lo.n_params * sizeof(float));
    be->zero(be, graph_loss_sum(g), sizeof(float));
    graph_set_batch(g, &batch);
    graph_train_step(g, &lo, 1.0f / batch.n_targets, 0);
    float sum;
    be->download(be, &sum, graph_loss_sum(g), sizeof sum);
    double loss = sum / batch.n_targets;
    *n = lo.n_params;
    *grads = ct_malloc(lo.n_params * sizeof(float));
    be->download(be, *grads, lo.grads, lo.n_params * sizeof(float));
    graph_free(g);
    batch_free(&batch);
    lora_free(&lo, be);
    model_free(&m);
    be->destroy(be);
    return loss;
}

#endif
