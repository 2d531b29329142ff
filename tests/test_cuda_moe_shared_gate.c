/* test_cuda_moe_shared_gate.c — the shared expert's per-token gate of qwen3_5_moe
 * and qwen3_next on CUDA (cuda/moe/moe_shared_gate.cu: moe_shared_gate_fwd / _bwd)
 * against the CPU reference, on random bf16-representable inputs: one token, token
 * counts that leave the last block of 8 rows part empty, rows that leave lanes
 * idle (H not a multiple of 256), row strides wider than H, gate strides above 1,
 * gates large enough to saturate the sigmoid; columns and gate elements outside
 * the op stay untouched, and the backward is bit-reproducible.
 *
 * Tolerances (normwise, check_max_norm_err; test_backend_cuda.c argues them): y
 * and ds (elementwise) 1e-2; dg (an fp32 dot over H, rounded to bf16) 2e-2.
 * Without a GPU every test reports "skip NAME: skipped: no GPU". */
#include "backend.h"
#include "check.h"
#include "cuda_pair.h"

#include <string.h>

/* T tokens of H at row stride ld for y, s, dy and ds; the gate and its gradient at
 * stride ldg; g uniform in [-ga, ga]. */
static void shared_gate_case(int T, int H, int ld, int ldg, float ga)
{
    size_t n = (size_t)T * ld, ng = (size_t)T * ldg;
    float *y0 = rnd(n, 1.0f), *s = rnd(n, 1.0f), *dy = rnd(n, 1.0f), *g = rnd(ng, ga), *g0 = rnd(ng, 1.0f);
    pair py = put_act(y0, n), ps = put_act(s, n), pdy = put_act(dy, n), pg = put_act(g, ng);
    pair pds = put_act(y0, n), pdg = put_act(g0, ng); /* outputs: what the op leaves alone must stay */

    cpu->moe_shared_gate_fwd(cpu, py.c, ld, ps.c, ld, pg.c, ldg, T, H);
    gpu->moe_shared_gate_fwd(gpu, py.g, ld, ps.g, ld, pg.g, ldg, T, H);
    double ey = act_err(py, T, H, ld);
    CHECK(ey < 1e-2, "fwd y rel err %g (T %d H %d ld %d ldg %d)", ey, T, H, ld, ldg);

    cpu->moe_shared_gate_bwd(cpu, pds.c, ld, pdg.c, ldg, pdy.c, ld, ps.c, ld, pg.c, ldg, T, H);
    gpu->moe_shared_gate_bwd(gpu, pds.g, ld, pdg.g, ldg, pdy.g, ld, ps.g, ld, pg.g, ldg, T, H);
    double eds = act_err(pds, T, H, ld), edg = act_err(pdg, T, 1, ldg);
    CHECK(eds < 1e-2, "bwd ds rel err %g (T %d H %d ld %d ldg %d)", eds, T, H, ld, ldg);
    CHECK(edg < 2e-2, "bwd dg rel err %g (T %d H %d ld %d ldg %d)", edg, T, H, ld, ldg);

    if (ld > H) { /* the columns past H of y and ds */
        size_t off = (size_t)H * gpu->act_bytes, offc = (size_t)H * cpu->act_bytes;
        double ecy = act_err((pair){(char *)py.c + offc, (char *)py.g + off}, T, ld - H, ld);
        double ecs = act_err((pair){(char *)pds.c + offc, (char *)pds.g + off}, T, ld - H, ld);
        CHECK(ecy == 0 && ecs == 0, "columns past H changed (y %g, ds %g)", ecy, ecs);
    }
    if (ldg > 1) { /* the gate gradient's elements between tokens */
        double ecg = act_err((pair){(char *)pdg.c + cpu->act_bytes, (char *)pdg.g + gpu->act_bytes}, T, ldg - 1, ldg);
        CHECK(ecg == 0, "dg between tokens changed (rel err %g)", ecg);
    }

    /* The same backward again: bit for bit. */
    size_t bytes = n * gpu->act_bytes, gbytes = ng * gpu->act_bytes;
    unsigned char *ds1 = ct_malloc(bytes), *ds2 = ct_malloc(bytes), *dg1 = ct_malloc(gbytes), *dg2 = ct_malloc(gbytes);
    gpu->download(gpu, ds1, pds.g, bytes);
    gpu->download(gpu, dg1, pdg.g, gbytes);
    gpu->moe_shared_gate_bwd(gpu, pds.g, ld, pdg.g, ldg, pdy.g, ld, ps.g, ld, pg.g, ldg, T, H);
    gpu->download(gpu, ds2, pds.g, bytes);
    gpu->download(gpu, dg2, pdg.g, gbytes);
    CHECK(memcmp(ds1, ds2, bytes) == 0 && memcmp(dg1, dg2, gbytes) == 0, "backward not bit-reproducible");

    drop(py); drop(ps); drop(pdy); drop(pg); drop(pds); drop(pdg);
    free(y0); free(s); free(dy); free(g); free(g0); free(ds1); free(ds2); free(dg1); free(dg2);
}

TEST(shared_gate_one_token)
{
    NEED_GPU();
    shared_gate_case(1, 64, 64, 1, 2.0f);
    shared_gate_case(1, 2048, 2048 + 64, 3, 2.0f);
}

TEST(shared_gate_partial_blocks_strides_wider_than_h)
{
    NEED_GPU();
    shared_gate_case(13, 200, 264, 3, 2.0f);        /* 25 of 32 lanes hold a chunk */
    shared_gate_case(1001, 2048, 2048 + 64, 1, 8.0f); /* the graph's dense gate (ldg 1), saturating */
    shared_gate_case(37, 4104, 4104 + 16, 2, 4.0f);  /* the row's last pass: 1 lane busy */
}

int main(void)
{
    ct_error err = {0};
    cpu = backend_cpu_new();
    gpu = backend_cuda_new(&err);
    if (!gpu) printf("# CUDA backend unavailable: %s\n", err.msg);
    ct_rng_seed(&rng, 31);
    RUN(shared_gate_one_token);
    RUN(shared_gate_partial_blocks_strides_wider_than_h);
    if (gpu) gpu->destroy(gpu);
    cpu->destroy(cpu);
    return check_summary();
}
