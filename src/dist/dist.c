/* dist.c — see dist.h. */
#include "dist.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"
#include "tcp_group.h"

struct ct_dist {
    int rank, world;
    ct_tcp_group *group;  /* NULL for world 1 */
    ct_nccl *nccl;        /* NULL: gradients summed over the TCP group */
    float *host_buf;      /* dist_sum_device over TCP: the gradients on the host */
    size_t host_cap;
    char describe[64];
    /* watchdog */
    double timeout_s;
    _Atomic double last_beat;   /* ct_now() of the last sign of progress */
    _Atomic long long step;
    _Atomic bool stopping;
    _Atomic bool in_collective; /* waiting on the TCP group, whose receives time out by themselves */
    pthread_t watchdog;
    bool has_watchdog;
};

/* ---- the launcher's environment ---- */

/* *out = the integer in variable `name`; false when unset or empty. */
static int env_int(const char *name, int lo, int hi, const char *expect, bool *found, int *out, ct_error *err)
{
    const char *s = getenv(name);
    *found = s && *s;
    if (!*found) return CT_OK;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi)
        return CT_FAIL_INPUT(err, "environment: %s=%s is not %s", name, s, expect);
    *out = (int)v;
    return CT_OK;
}

int dist_env_read(ct_dist_env *e, ct_error *err)
{
    memset(e, 0, sizeof *e);
    e->world = 1;
    static const struct { const char *launcher, *rank, *world, *local; } kinds[] = {
        {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
        /* srun's step size, not the allocation's SLURM_NTASKS: a batch script that
         * runs ctune once, without srun, is one process */
        {"slurm", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"},
        {"mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        bool has_world, has_rank, has_local;
        int rc = env_int(kinds[k].world, 1, 1 << 20, "an integer >= 1", &has_world, &e->world, err);
        if (rc) return rc;
        if (!has_world) continue;
        if ((rc = env_int(kinds[k].rank, 0, e->world - 1, "a rank in [0, the world size)", &has_rank, &e->rank, err)))
            return rc;
        if (!has_rank)
            return CT_FAIL_INPUT(err, "environment: %s=%d is set but %s is not (expected both, as %s sets them)",
                                 kinds[k].world, e->world, kinds[k].rank, kinds[k].launcher);
        if ((rc = env_int(kinds[k].local, 0, INT_MAX, "an integer >= 0", &has_local, &e->local_rank, err))) return rc;
        if (!has_local) e->local_rank = e->rank; /* one node */
        e->launcher = kinds[k].launcher;
        break;
    }
    if (e->world == 1) return CT_OK;
    const char *addr = getenv("MASTER_ADDR");
    if (!addr || !*addr)
        return CT_FAIL_INPUT(err, "environment: %s sets %d ranks but MASTER_ADDR is not set (expected the host of rank "
                             "0, the same on every rank, and MASTER_PORT)", e->launcher, e->world);
    if (strlen(addr) >= sizeof e->master_addr)
        return CT_FAIL_INPUT(err, "environment: MASTER_ADDR is longer than %zu characters", sizeof e->master_addr - 1);
    strcpy(e->master_addr, addr);
    bool has_port;
    int rc = env_int("MASTER_PORT", 1, 65535, "a TCP port in [1, 65535]", &has_port, &e->master_port, err);
    if (!rc && !has_port)
        rc = CT_FAIL_INPUT(err, "environment: %s sets %d ranks but MASTER_PORT is not set (expected rank 0's TCP "
                           "port, the same on every rank)", e->launcher, e->world);
    return rc;
}

/* ---- the watchdog ---- */

/* How often the watchdog looks, and how much longer than the timeout a rank
 * waits on a peer in a collective: the peer's own watchdog must end it first,
 * so that the stuck rank is the first to fail and the one the launcher names
 * (with equal limits the waiting rank sometimes gave up first). */
#define WATCHDOG_POLL_S 0.25
#define WAIT_SLACK_S 2.0

/* A rank that shows no progress for the timeout is stuck where no receive
 * times out (a GPU wait behind an NCCL collective whose peer died): it ends
 * itself, which closes its sockets, so the ranks waiting on it hear of it. */
static void *watchdog_main(void *arg)
{
    ct_dist *d = arg;
    while (!atomic_load(&d->stopping)) {
        nanosleep(&(struct timespec){0, (long)(WATCHDOG_POLL_S * 1e9)}, NULL);
        double idle = ct_now() - atomic_load(&d->last_beat);
        if (idle > d->timeout_s && !atomic_load(&d->stopping) && !atomic_load(&d->in_collective)) {
            fprintf(stderr, "\nerror: rank %d: no progress for %g s after step %lld (stuck on the GPU or waiting "
                    "on a rank that died); stopping this rank (HINT: the first rank that failed is named by ctune "
                    "or the launcher; distributed.timeout_seconds sets this limit)\n",
                    d->rank, d->timeout_s, atomic_load(&d->step));
            _exit(1);
        }
    }
    return NULL;
}

void dist_beat(ct_dist *d)
{
    if (d) atomic_store(&d->last_beat, ct_now());
}

/* ---- the group ---- */

ct_dist *dist_open(const ct_dist_env *e, ct_backend *be, double timeout_s, bool host_reduce, ct_error *err)
{
    ct_dist *d = ct_calloc(1, sizeof *d);
    d->rank = e->rank;
    d->world = e->world;
    d->timeout_s = timeout_s;
    atomic_store(&d->last_beat, ct_now());
    snprintf(d->describe, sizeof d->describe, "one process");
    if (d->world == 1) return d;
    if (!(d->group = tcp_group_open(e->master_addr, e->master_port, e->rank, e->world, timeout_s, err))) goto fail;
    tcp_group_set_timeout(d->group, timeout_s + WAIT_SLACK_S);
    snprintf(d->describe, sizeof d->describe, "gradients summed through rank 0 over TCP");
    if (be->native_stream && !host_reduce) {
        /* NVLink multicast (NVLS) can take a shared host's GPUs out of service
         * when a run dies; off unless the user asks for it */
        setenv("NCCL_NVLS_ENABLE", "0", 0);
        if (!(d->nccl = nccl_load(err))) goto fail;
        unsigned char id[CT_NCCL_ID_BYTES] = {0};
        if (d->rank == 0 && nccl_unique_id(d->nccl, id, err)) goto fail;
        if (tcp_group_broadcast(d->group, id, sizeof id, err)) goto fail;
        if (nccl_comm_init(d->nccl, d->world, id, d->rank, err)) goto fail;
        snprintf(d->describe, sizeof d->describe, "gradients summed by %s", nccl_version(d->nccl));
    }
    if (pthread_create(&d->watchdog, NULL, watchdog_main, d) == 0) d->has_watchdog = true;
    return d;
fail:
    dist_close(d, true);
    return NULL;
}

void dist_close(ct_dist *d, bool failed)
{
    if (!d) return;
    atomic_store(&d->stopping, true);
    if (d->has_watchdog) pthread_join(d->watchdog, NULL);
    nccl_close(d->nccl, failed);
    tcp_group_close(d->group);
    free(d->host_buf);
    free(d);
}

int dist_rank(const ct_dist *d) { return d->rank; }
int dist_world(const ct_dist *d) { return d->world; }
bool dist_owns(const ct_dist *d, size_t i) { return i % (size_t)d->world == (size_t)d->rank; }
const char *dist_describe(const ct_dist *d) { return d->describe; }

int dist_sum_device(ct_dist *d, ct_backend *be, float *x, size_t n, ct_error *err)
{
    if (d->world == 1) return CT_OK;
    if (d->nccl) return nccl_sum_f32(d->nccl, x, n, be->native_stream(be), err);
    if (d->host_cap < n) {
        free(d->host_buf);
        d->host_buf = ct_malloc(n * sizeof(float));
        d->host_cap = n;
    }
    be->download(be, d->host_buf, x, n * sizeof(float));
    int rc = dist_sum_host(d, d->host_buf, n, err);
    if (!rc) be->upload(be, x, d->host_buf, n * sizeof(float));
    return rc;
}

int dist_sum_host(ct_dist *d, float *x, size_t n, ct_error *err)
{
    if (d->world == 1) return CT_OK;
    atomic_store(&d->in_collective, true);
    int rc = tcp_group_allreduce_sum_f32(d->group, x, n, err);
    atomic_store(&d->in_collective, false);
    dist_beat(d);
    return rc;
}

int dist_agree(ct_dist *d, long long step, int sig, int *stop_sig, ct_error *err)
{
    atomic_store(&d->step, step);
    *stop_sig = sig;
    if (d->world == 1) return CT_OK;
    enum { WANT_INT = 1u, WANT_TERM = 2u };
    uint32_t flags = sig == SIGTERM ? WANT_TERM : sig ? WANT_INT : 0u;
    atomic_store(&d->in_collective, true);
    int rc = tcp_group_barrier_or(d->group, &flags, err);
    atomic_store(&d->in_collective, false);
    dist_beat(d);
    if (rc) return rc;
    *stop_sig = flags & WANT_TERM ? SIGTERM : flags & WANT_INT ? SIGINT : 0;
    return CT_OK;
}
