/* test_tcp_group.c — the TCP rank group (src/dist/tcp_group.h). Every rank is a
 * thread of this process talking over 127.0.0.1 on a fresh port; the threads
 * only record what happened, and the checks run after they are joined. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "tcp_group.h"

#define MAX_RANKS 4

typedef struct rank_run rank_run;
/* What one rank does with its open group; returns the code of the call tested. */
typedef int (*rank_body)(rank_run *rr, ct_tcp_group *g);

struct rank_run {
    int rank, world, port;
    double timeout_s;       /* for open and for the collectives */
    rank_body body;
    float *f;               /* the rank's data, n elements or bytes */
    double *d;
    uint8_t *bytes;
    size_t n;
    uint32_t flags;
    bool opened;
    int rc;                 /* body's result */
    ct_error err;           /* open's or body's error */
    ct_error err2;          /* a second call after a failure */
    int rc2;
    double elapsed_s;       /* time the body took */
    double elapsed2_s;      /* time the second call took */
};

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {}
}

/* A port nothing listens on now: the kernel's pick for port 0. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

static void *rank_main(void *arg)
{
    rank_run *rr = arg;
    ct_tcp_group *g = tcp_group_open("127.0.0.1", rr->port, rr->rank, rr->world, rr->timeout_s, &rr->err);
    rr->opened = g != NULL;
    if (g) {
        double t = ct_now();
        rr->rc = rr->body ? rr->body(rr, g) : CT_OK;
        rr->elapsed_s = ct_now() - t;
        tcp_group_close(g);
    }
    return NULL;
}

/* Runs ranks[0..count) as threads on one fresh port and waits for them all. */
static void run_ranks(rank_run *ranks, int count)
{
    int port = free_port();
    pthread_t t[MAX_RANKS];
    for (int i = 0; i < count; i++) {
        ranks[i].port = port;
        if (ranks[i].timeout_s == 0) ranks[i].timeout_s = 5.0;
        pthread_create(&t[i], NULL, rank_main, &ranks[i]);
    }
    for (int i = 0; i < count; i++) pthread_join(t[i], NULL);
}

static int body_allreduce_f32(rank_run *rr, ct_tcp_group *g)
{
    return tcp_group_allreduce_sum_f32(g, rr->f, rr->n, &rr->err);
}
static int body_allreduce_f64(rank_run *rr, ct_tcp_group *g)
{
    return tcp_group_allreduce_sum_f64(g, rr->d, rr->n, &rr->err);
}
static int body_broadcast(rank_run *rr, ct_tcp_group *g) { return tcp_group_broadcast(g, rr->bytes, rr->n, &rr->err); }
static int body_barrier(rank_run *rr, ct_tcp_group *g) { return tcp_group_barrier_or(g, &rr->flags, &rr->err); }
static int body_exit_soon(rank_run *rr, ct_tcp_group *g) { sleep_s(0.2); return CT_OK; }
static int body_sleep_then_allreduce(rank_run *rr, ct_tcp_group *g) { sleep_s(1.6); return body_allreduce_f32(rr, g); }
/* Fails, then calls again: the second call must repeat the first error. */
static int body_allreduce_twice(rank_run *rr, ct_tcp_group *g)
{
    int rc = body_allreduce_f32(rr, g);
    double t = ct_now();
    rr->rc2 = tcp_group_barrier_or(g, &rr->flags, &rr->err2);
    rr->elapsed2_s = ct_now() - t;
    return rc;
}

/* Whether the rank failed with code and a message holding text. */
static bool failed_with(const rank_run *rr, int code, const char *text)
{
    return rr->err.code == code && strstr(rr->err.msg, text) != NULL;
}

/* world ranks that all run body with timeout_s. */
static void ranks_init(rank_run *ranks, int world, rank_body body, double timeout_s)
{
    for (int r = 0; r < world; r++) ranks[r] = (rank_run){.rank = r, .world = world, .body = body, .timeout_s = timeout_s};
}

TEST(world_of_one_opens_no_socket_and_leaves_data_alone)
{
    ct_error err = {0};
    ct_tcp_group *g = tcp_group_open("127.0.0.1", 1, 0, 1, 1.0, &err);
    REQUIRE(g, "%s", err.msg);
    float f[3] = {1.5f, -2, 3};
    double d[2] = {0.25, 7};
    uint8_t b[4] = {1, 2, 3, 4};
    uint32_t flags = 5;
    CHECK(tcp_group_allreduce_sum_f32(g, f, 3, &err) == CT_OK && f[0] == 1.5f && f[1] == -2 && f[2] == 3, "f32 %s", err.msg);
    CHECK(tcp_group_allreduce_sum_f64(g, d, 2, &err) == CT_OK && d[0] == 0.25 && d[1] == 7, "f64 %s", err.msg);
    CHECK(tcp_group_broadcast(g, b, 4, &err) == CT_OK && b[3] == 4, "broadcast %s", err.msg);
    CHECK(tcp_group_barrier_or(g, &flags, &err) == CT_OK && flags == 5, "barrier %s", err.msg);
    CHECK(tcp_group_rank(g) == 0 && tcp_group_world(g) == 1, "rank %d world %d", tcp_group_rank(g), tcp_group_world(g));
    tcp_group_close(g);
    tcp_group_close(NULL);
}

TEST(allreduce_f32_adds_in_rank_order_bit_for_bit_on_every_rank)
{
    /* Order matters here: (1e8 + 1) - 1e8 is 0 in float, 1e8 - 1e8 + 1 is 1. */
    const float v[3][4] = {{1e8f, 0.1f, 3, -0.0f}, {1, 0.2f, 1e-30f, -0.0f}, {-1e8f, 0.3f, -3, -0.0f}};
    float x[3][4], want[4];
    rank_run ranks[3];
    ranks_init(ranks, 3, body_allreduce_f32, 5.0);
    for (int r = 0; r < 3; r++) { memcpy(x[r], v[r], sizeof x[r]); ranks[r].f = x[r]; ranks[r].n = 4; }
    for (int i = 0; i < 4; i++) { volatile float s = v[0][i] + v[1][i]; want[i] = s + v[2][i]; }
    CHECK(want[0] == 0.0f && signbit(want[3]), "the test's own sums: %g %g", want[0], want[3]);
    run_ranks(ranks, 3);
    for (int r = 0; r < 3; r++) {
        REQUIRE(ranks[r].opened && ranks[r].rc == CT_OK, "rank %d: %s", r, ranks[r].err.msg);
        CHECK(memcmp(x[r], want, sizeof want) == 0, "rank %d got %.9g %.9g %.9g %g", r, x[r][0], x[r][1], x[r][2], x[r][3]);
    }
}

TEST(allreduce_f32_streams_8m_floats)
{
    const size_t n = 8u << 20;
    rank_run ranks[3];
    ranks_init(ranks, 3, body_allreduce_f32, 5.0);
    for (int r = 0; r < 3; r++) {
        ranks[r].f = malloc(n * sizeof(float));
        ranks[r].n = n;
        for (size_t i = 0; i < n; i++) ranks[r].f[i] = (float)(i % 1001) * 0.37f * (float)(r + 1) - (float)r;
    }
    run_ranks(ranks, 3);
    for (int r = 0; r < 3; r++) {
        CHECK(ranks[r].opened && ranks[r].rc == CT_OK, "rank %d: %s", r, ranks[r].err.msg);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            float b = (float)(i % 1001) * 0.37f;
            volatile float s = b - 0.0f + (b * 2.0f - 1.0f);
            float want = s + (b * 3.0f - 2.0f);
            bad += memcmp(&ranks[r].f[i], &want, sizeof want) != 0;
        }
        CHECK(bad == 0, "rank %d: %zu of %zu elements differ from the rank-order sum", r, bad, n);
    }
    for (int r = 0; r < 3; r++) free(ranks[r].f);
}

TEST(allreduce_f64_sums_over_ranks)
{
    double x[3][3] = {{1, 0.5, 1e300}, {2, 0.25, -1e300}, {4, 0.125, 1}};
    rank_run ranks[3];
    ranks_init(ranks, 3, body_allreduce_f64, 5.0);
    for (int r = 0; r < 3; r++) { ranks[r].d = x[r]; ranks[r].n = 3; }
    run_ranks(ranks, 3);
    for (int r = 0; r < 3; r++) {
        REQUIRE(ranks[r].opened && ranks[r].rc == CT_OK, "rank %d: %s", r, ranks[r].err.msg);
        CHECK(x[r][0] == 7 && x[r][1] == 0.875 && x[r][2] == 1, "rank %d got %g %g %g", r, x[r][0], x[r][1], x[r][2]);
    }
}

TEST(broadcast_copies_rank_0_bytes_to_every_rank)
{
    const size_t n = (3u << 20) + 7;   /* several pieces and a ragged end */
    rank_run ranks[3];
    ranks_init(ranks, 3, body_broadcast, 5.0);
    for (int r = 0; r < 3; r++) {
        ranks[r].bytes = malloc(n);
        ranks[r].n = n;
        for (size_t i = 0; i < n; i++) ranks[r].bytes[i] = (uint8_t)(r == 0 ? i * 31 + 7 : 0xee);
    }
    run_ranks(ranks, 3);
    for (int r = 0; r < 3; r++) {
        CHECK(ranks[r].opened && ranks[r].rc == CT_OK, "rank %d: %s", r, ranks[r].err.msg);
        CHECK(memcmp(ranks[r].bytes, ranks[0].bytes, n) == 0, "rank %d differs from rank 0", r);
        CHECK(ranks[r].bytes[n - 1] == (uint8_t)((n - 1) * 31 + 7), "rank %d: last byte %u", r, ranks[r].bytes[n - 1]);
    }
    for (int r = 0; r < 3; r++) free(ranks[r].bytes);
}

TEST(barrier_or_ors_the_flags_of_every_rank)
{
    rank_run ranks[3];
    ranks_init(ranks, 3, body_barrier, 5.0);
    for (int r = 0; r < 3; r++) ranks[r].flags = r == 0 ? 0 : 1u << r;
    run_ranks(ranks, 3);
    for (int r = 0; r < 3; r++) {
        REQUIRE(ranks[r].opened && ranks[r].rc == CT_OK, "rank %d: %s", r, ranks[r].err.msg);
        CHECK(ranks[r].flags == 6, "rank %d flags %u", r, ranks[r].flags);
    }
}

/* Many small collectives of every kind, as a training loop does them. */
static int body_many_steps(rank_run *rr, ct_tcp_group *g)
{
    for (int step = 0; step < 200; step++) {
        float f = (float)rr->rank;
        double d = step;
        uint32_t stop = rr->rank == 1 && step == 199;
        uint8_t b = (uint8_t)(rr->rank == 0 ? step : 0);
        int rc = tcp_group_allreduce_sum_f32(g, &f, 1, &rr->err);
        if (rc == CT_OK) rc = tcp_group_allreduce_sum_f64(g, &d, 1, &rr->err);
        if (rc == CT_OK) rc = tcp_group_broadcast(g, &b, 1, &rr->err);
        if (rc == CT_OK) rc = tcp_group_barrier_or(g, &stop, &rr->err);
        if (rc != CT_OK) return rc;
        if (f != 3 || d != 3.0 * step || b != (uint8_t)step || stop != (step == 199))
            return CT_FAIL_RUNTIME(&rr->err, "step %d: f %g d %g b %u stop %u", step, f, d, b, stop);
    }
    return CT_OK;
}

TEST(collectives_of_every_kind_stay_in_step_over_many_calls)
{
    rank_run ranks[3];
    ranks_init(ranks, 3, body_many_steps, 5.0);
    run_ranks(ranks, 3);
    for (int r = 0; r < 3; r++) CHECK(ranks[r].opened && ranks[r].rc == CT_OK, "rank %d: %s", r, ranks[r].err.msg);
}

/* Signals without SA_RESTART, as the trainer installs them, hit the ranks
 * while they stream: every interrupted call must be retried. */
static atomic_int signals_stop, ranks_done, ranks_release;
static void on_signal(int sig) { (void)sig; }
static int body_allreduce_then_wait(rank_run *rr, ct_tcp_group *g)
{
    int rc = body_allreduce_f32(rr, g);
    atomic_fetch_add(&ranks_done, 1);
    while (!atomic_load(&ranks_release)) sleep_s(0.001);   /* stays alive for pthread_kill */
    return rc;
}
static void *send_signals(void *arg)
{
    pthread_t *threads = arg;
    while (!atomic_load(&signals_stop)) {
        for (int r = 0; r < 3; r++) pthread_kill(threads[r], SIGUSR1);
        sleep_s(0.0005);
    }
    return NULL;
}

TEST(collectives_retry_calls_interrupted_by_signals)
{
    struct sigaction sa = {.sa_handler = on_signal}, old;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, &old);   /* sa_flags 0: no SA_RESTART */
    const size_t n = 1u << 21;
    rank_run ranks[3];
    ranks_init(ranks, 3, body_allreduce_then_wait, 5.0);
    atomic_store(&signals_stop, 0), atomic_store(&ranks_done, 0), atomic_store(&ranks_release, 0);
    int port = free_port();
    pthread_t t[3], killer;
    for (int r = 0; r < 3; r++) {
        ranks[r].f = malloc(n * sizeof(float));
        ranks[r].n = n;
        ranks[r].port = port;
        for (size_t i = 0; i < n; i++) ranks[r].f[i] = (float)(r + 1);
        pthread_create(&t[r], NULL, rank_main, &ranks[r]);
    }
    pthread_create(&killer, NULL, send_signals, t);
    double t0 = ct_now();
    while (atomic_load(&ranks_done) < 3 && ct_now() - t0 < 20) sleep_s(0.001);
    atomic_store(&signals_stop, 1);
    pthread_join(killer, NULL);
    atomic_store(&ranks_release, 1);
    for (int r = 0; r < 3; r++) pthread_join(t[r], NULL);
    sigaction(SIGUSR1, &old, NULL);
    for (int r = 0; r < 3; r++) {
        CHECK(ranks[r].opened && ranks[r].rc == CT_OK, "rank %d: %s", r, ranks[r].err.msg);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) bad += ranks[r].f[i] != 6.0f;
        CHECK(bad == 0, "rank %d: %zu wrong sums", r, bad);
        free(ranks[r].f);
    }
}

TEST(rank_that_closes_mid_collective_fails_the_others_naming_it)
{
    float x[3][8] = {{0}};
    rank_run ranks[3];
    ranks_init(ranks, 3, body_allreduce_f32, 1.0);
    ranks[2].body = body_exit_soon;
    for (int r = 0; r < 3; r++) { ranks[r].f = x[r]; ranks[r].n = 8; }
    run_ranks(ranks, 3);
    for (int r = 0; r < 2; r++) {
        REQUIRE(ranks[r].opened, "rank %d: %s", r, ranks[r].err.msg);
        CHECK(failed_with(&ranks[r], CT_ERR_RUNTIME, "rank 2 closed its connection"), "rank %d: %s", r, ranks[r].err.msg);
        CHECK(ranks[r].elapsed_s < 0.9, "rank %d took %.2f s: waited for the timeout", r, ranks[r].elapsed_s);
    }
}

TEST(failed_group_repeats_its_first_error_at_once)
{
    float x[3][8] = {{0}};
    rank_run ranks[3];
    ranks_init(ranks, 3, body_allreduce_twice, 1.0);
    ranks[2].body = body_exit_soon;
    for (int r = 0; r < 3; r++) { ranks[r].f = x[r]; ranks[r].n = 8; }
    run_ranks(ranks, 3);
    for (int r = 0; r < 2; r++) {
        REQUIRE(ranks[r].opened && ranks[r].rc != CT_OK, "rank %d: %s", r, ranks[r].err.msg);
        CHECK(ranks[r].rc2 == ranks[r].rc && strcmp(ranks[r].err2.msg, ranks[r].err.msg) == 0,
              "rank %d: second call %d '%s' after '%s'", r, ranks[r].rc2, ranks[r].err2.msg, ranks[r].err.msg);
        CHECK(ranks[r].elapsed2_s < 0.05, "rank %d: second call took %.3f s", r, ranks[r].elapsed2_s);
    }
}

TEST(rank_that_never_joins_fails_open_on_rank_0_naming_it)
{
    rank_run ranks[3];
    ranks_init(ranks, 3, NULL, 1.0);   /* rank 2 never starts */
    run_ranks(ranks, 2);
    CHECK(!ranks[0].opened, "rank 0 opened");
    CHECK(failed_with(&ranks[0], CT_ERR_RUNTIME, "only 2 of 3 ranks connected to 127.0.0.1:"), "rank 0: %s", ranks[0].err.msg);
    CHECK(strstr(ranks[0].err.msg, "within 1 s (missing: rank 2)"), "rank 0: %s", ranks[0].err.msg);
    CHECK(!ranks[1].opened && strstr(ranks[1].err.msg, "rank 1: rank 0 at 127.0.0.1:"), "rank 1: %s", ranks[1].err.msg);
}

TEST(unreachable_rank_0_fails_open_naming_address_and_port)
{
    rank_run one = {.rank = 1, .world = 2, .timeout_s = 0.3};
    run_ranks(&one, 1);
    char want[96];
    snprintf(want, sizeof want, "rank 1: cannot reach rank 0 at 127.0.0.1:%d within 0.3 s (connection refused)", one.port);
    CHECK(!one.opened && strstr(one.err.msg, want), "%s", one.err.msg);
}

TEST(silent_rank_fails_the_others_naming_it)
{
    float x[3][8] = {{0}};
    rank_run ranks[3];
    ranks_init(ranks, 3, body_allreduce_f32, 1.0);
    ranks[2].body = body_sleep_then_allreduce;
    for (int r = 0; r < 3; r++) { ranks[r].f = x[r]; ranks[r].n = 8; }
    run_ranks(ranks, 3);
    for (int r = 0; r < 3; r++) {
        REQUIRE(ranks[r].opened, "rank %d: %s", r, ranks[r].err.msg);
        CHECK(failed_with(&ranks[r], CT_ERR_RUNTIME, "rank 2 sent nothing for 1 s"), "rank %d: %s", r, ranks[r].err.msg);
    }
    for (int r = 0; r < 2; r++) CHECK(ranks[r].elapsed_s < 1.5, "rank %d took %.2f s", r, ranks[r].elapsed_s);
}

TEST(hello_with_another_world_is_refused_on_both_sides)
{
    rank_run ranks[2];
    ranks_init(ranks, 2, NULL, 2.0);
    ranks[1].world = 3;
    run_ranks(ranks, 2);
    CHECK(!ranks[0].opened && failed_with(&ranks[0], CT_ERR_INPUT, "rank 1 joined with world 3 but rank 0's world is 2"),
          "rank 0: %s", ranks[0].err.msg);
    CHECK(!ranks[1].opened && failed_with(&ranks[1], CT_ERR_INPUT, "refused us: our world 3 differs from its world 2"),
          "rank 1: %s", ranks[1].err.msg);
}

TEST(rank_that_joins_twice_is_refused)
{
    rank_run ranks[3];
    ranks_init(ranks, 3, NULL, 2.0);
    ranks[2].rank = 1;
    run_ranks(ranks, 3);
    CHECK(!ranks[0].opened && failed_with(&ranks[0], CT_ERR_INPUT, "two processes joined as rank 1"), "rank 0: %s", ranks[0].err.msg);
    CHECK(!ranks[1].opened && !ranks[2].opened, "a rank 1 opened");
}

TEST(port_in_use_on_rank_0_is_named)
{
    int port = free_port();
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 1) == 0, "cannot hold port %d", port);
    ct_error err = {0};
    ct_tcp_group *g = tcp_group_open("127.0.0.1", port, 0, 2, 1.0, &err);
    char want[64];
    snprintf(want, sizeof want, "port %d on 127.0.0.1 is already in use", port);
    CHECK(!g && strstr(err.msg, want), "%s", err.msg);
    tcp_group_close(g);
    close(fd);
}

TEST(allreduce_with_another_n_is_refused_naming_both_ranks)
{
    float x[3][1000] = {{0}};
    rank_run ranks[3];
    ranks_init(ranks, 3, body_allreduce_f32, 2.0);
    for (int r = 0; r < 3; r++) { ranks[r].f = x[r]; ranks[r].n = r == 2 ? 999 : 1000; }
    run_ranks(ranks, 3);
    for (int r = 0; r < 3; r++) {
        REQUIRE(ranks[r].opened, "rank %d: %s", r, ranks[r].err.msg);
        CHECK(failed_with(&ranks[r], CT_ERR_RUNTIME, "rank 2 is in allreduce_f32 #1 (n = 999) while rank 0 is in allreduce_f32 #1 (n = 1000)"),
              "rank %d: %s", r, ranks[r].err.msg);
    }
}

TEST(ranks_in_different_collectives_are_refused_naming_both)
{
    float x[2][4] = {{0}};
    rank_run ranks[2];
    ranks_init(ranks, 2, body_allreduce_f32, 2.0);
    ranks[1].body = body_barrier;
    for (int r = 0; r < 2; r++) { ranks[r].f = x[r]; ranks[r].n = 4; }
    run_ranks(ranks, 2);
    for (int r = 0; r < 2; r++) {
        REQUIRE(ranks[r].opened, "rank %d: %s", r, ranks[r].err.msg);
        CHECK(failed_with(&ranks[r], CT_ERR_RUNTIME, "rank 1 is in barrier_or #1 (n = 1) while rank 0 is in allreduce_f32 #1 (n = 4)"),
              "rank %d: %s", r, ranks[r].err.msg);
    }
}

int main(void)
{
    RUN(world_of_one_opens_no_socket_and_leaves_data_alone);
    RUN(allreduce_f32_adds_in_rank_order_bit_for_bit_on_every_rank);
    RUN(allreduce_f32_streams_8m_floats);
    RUN(allreduce_f64_sums_over_ranks);
    RUN(broadcast_copies_rank_0_bytes_to_every_rank);
    RUN(barrier_or_ors_the_flags_of_every_rank);
    RUN(collectives_of_every_kind_stay_in_step_over_many_calls);
    RUN(collectives_retry_calls_interrupted_by_signals);
    RUN(rank_that_closes_mid_collective_fails_the_others_naming_it);
    RUN(failed_group_repeats_its_first_error_at_once);
    RUN(rank_that_never_joins_fails_open_on_rank_0_naming_it);
    RUN(unreachable_rank_0_fails_open_naming_address_and_port);
    RUN(silent_rank_fails_the_others_naming_it);
    RUN(hello_with_another_world_is_refused_on_both_sides);
    RUN(rank_that_joins_twice_is_refused);
    RUN(port_in_use_on_rank_0_is_named);
    RUN(allreduce_with_another_n_is_refused_naming_both_ranks);
    RUN(ranks_in_different_collectives_are_refused_naming_both);
    return check_summary();
}
