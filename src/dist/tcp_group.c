/* tcp_group.c — see tcp_group.h.
 *
 * Wire format (native byte order; the hello's magic tells a foreign peer):
 *   hello  rank r -> rank 0  {magic, version, r, world}              4 x u32
 *   reply  rank 0 -> rank r  {magic, version, status, world}         4 x u32
 *   frame  either way        {op, seq, bytes} (u32, u32, u64), then the payload
 * In a collective every rank r > 0 sends one frame {op, seq, size} whose payload
 * is its data (all-reduce, barrier) or nothing (broadcast: the size is only
 * checked). Rank 0 checks every rank's header against its own, then streams:
 * piece c (TG_CHUNK bytes) is combined in rank order once every rank's piece c is
 * in, and goes back to every rank as a frame of its own while later pieces still
 * arrive. So rank 0 holds one piece per rank, up- and downstream overlap, and a
 * rank writes results only into the part of x it has already sent.
 * All sockets are non-blocking and every wait is a poll() with a deadline; each
 * peer has its own progress clock, so a timeout names the peer we wait for.
 * On an error rank 0 finishes the frame in flight to each rank and sends an
 * OP_ABORT frame carrying the reason, then shuts its side down. */
#include "tcp_group.h"

#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TG_MAGIC   0x31475443u         /* "CTG1" */
#define TG_VERSION 1u
#define TG_CHUNK   ((size_t)1 << 20)   /* big enough to stream at full speed, small enough to hold one per rank */
#define TG_HELLO_S 5.0                 /* a connection that says nothing this long is not a ctune rank */
#define TG_ABORT_S 5.0                 /* the most an error waits to tell the other ranks */
#define TG_REASON  700                 /* longest reason an abort frame carries, NUL included */

enum { OP_ALLREDUCE_F32 = 1, OP_ALLREDUCE_F64, OP_BROADCAST, OP_BARRIER_OR, OP_ABORT };
enum { ST_OK = 0, ST_VERSION, ST_WORLD, ST_RANK, ST_DUPLICATE, ST_GAVE_UP };

typedef struct frame_hdr { uint32_t op, seq; uint64_t bytes; } frame_hdr;
typedef struct hello_msg { uint32_t magic, version, rank_or_status, world; } hello_msg;

typedef struct peer {            /* rank 0's view of one other rank in a collective */
    int fd;
    frame_hdr in_hdr;
    size_t in_hdr_got;
    bool hdr_ok;                 /* in_hdr is complete and matches ours */
    size_t in_off;               /* payload bytes received */
    size_t out_frame, out_off;   /* frame being sent back; its bytes sent, header included */
    size_t abort_off;            /* bytes of the abort frame sent */
    double last;                 /* ct_now() of the last progress */
} peer;

struct ct_tcp_group {
    int rank, world;
    double timeout_s;
    char where[300];             /* "host:port" of rank 0, for messages */
    uint32_t op, seq;            /* the collective in progress (seq counts from 1) */
    peer *peers;                 /* [world]; rank 0 uses 1..world-1, others peers[0] (rank 0) */
    struct pollfd *pfd;          /* [world]: rank 0 polls rank r at pfd[r] (fd -1: not now) */
    uint8_t *bufs;               /* rank 0: TG_CHUNK bytes per other rank */
    int broken_rank;             /* the peer whose connection failed, -1 if none */
    char reason[TG_REASON];      /* what went wrong, as sent in OP_ABORT */
    ct_error failure;            /* the first error; code != CT_OK makes the group unusable */
};

// ---- small helpers ----

static const char *op_name(uint32_t op)
{
    switch (op) {
    case OP_ALLREDUCE_F32: return "allreduce_f32";
    case OP_ALLREDUCE_F64: return "allreduce_f64";
    case OP_BROADCAST: return "broadcast";
    case OP_BARRIER_OR: return "barrier_or";
    default: return "unknown op";
    }
}

/* "allreduce_f32 #7 (n = 1024)": what a rank is doing, for mismatch messages. */
static void describe(char *buf, size_t cap, const frame_hdr *h)
{
    uint64_t unit = h->op == OP_ALLREDUCE_F64 ? 8 : h->op == OP_BROADCAST ? 1 : 4;
    snprintf(buf, cap, "%s #%u (%s = %llu)", op_name(h->op), h->seq,
             h->op == OP_BROADCAST ? "bytes" : "n", (unsigned long long)(h->bytes / unit));
}

static int poll_ms(double s) { return s <= 0 ? 0 : s > 1e6 ? 1000000000 : (int)(s * 1000.0) + 1; }

/* One non-blocking send or receive of up to n > 0 bytes: the count moved, 0 if
 * the socket is full (or empty), -1 with errno (0 for the end of the stream). */
static ssize_t io_move(int fd, void *p, size_t n, bool writing)
{
    for (;;) {
        ssize_t k = writing ? send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p, n, MSG_DONTWAIT);
        if (k > 0 || (k == 0 && writing)) return k;
        if (k == 0) { errno = 0; return -1; }
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    }
}

/* Waits until fd is ready for ev or the deadline passes: 1 ready (or failed, for
 * the next I/O call to report), 0 timed out. */
static int wait_fd(int fd, short ev, double deadline)
{
    for (;;) {
        double left = deadline - ct_now();
        if (left <= 0) return 0;
        struct pollfd p = {fd, ev, 0};
        int rc = poll(&p, 1, poll_ms(left));
        if (rc > 0 || (rc < 0 && errno != EINTR)) return 1;
    }
}

/* Sends or receives exactly n bytes by the deadline (used while forming the
 * group): 0 done, -1 failed (errno; 0 for end of stream), -2 timed out. */
static int io_exact(int fd, void *buf, size_t n, bool writing, double deadline)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t k = io_move(fd, p, n, writing);
        if (k < 0) return -1;
        p += k, n -= (size_t)k;
        if (n && k == 0 && !wait_fd(fd, writing ? POLLOUT : POLLIN, deadline)) return -2;
    }
    return 0;
}

/* strerror in lower case, to read inside a sentence. */
static const char *reason_of(int e, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", e == ETIMEDOUT ? "timed out" : strerror(e));
    buf[0] = (char)tolower((unsigned char)buf[0]);
    return buf;
}

/* Records what went wrong in this collective; broken: the peer whose
 * connection failed (no abort frame goes to it), -1 if none. */
static int set_reason(ct_tcp_group *g, int broken, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int set_reason(ct_tcp_group *g, int broken, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->reason, sizeof g->reason, fmt, ap);
    va_end(ap);
    g->broken_rank = broken;
    return CT_ERR_RUNTIME;
}

/* The connection to rank r failed in a read or send (errno as left by io_*). */
static int conn_fail(ct_tcp_group *g, int r)
{
    char e[128];
    if (errno == 0 || errno == ECONNRESET || errno == EPIPE)
        return set_reason(g, r, "rank %d closed its connection (it exited or was killed)", r);
    return set_reason(g, r, "the connection to rank %d failed: %s", r, reason_of(errno, e, sizeof e));
}

/* dst op= src, element by element in the element's own type. */
static void combine(uint32_t op, void *dst, const void *src, size_t bytes)
{
    if (op == OP_ALLREDUCE_F32) for (size_t i = 0; i < bytes / 4; i++) ((float *)dst)[i] += ((const float *)src)[i];
    if (op == OP_ALLREDUCE_F64) for (size_t i = 0; i < bytes / 8; i++) ((double *)dst)[i] += ((const double *)src)[i];
    if (op == OP_BARRIER_OR) for (size_t i = 0; i < bytes / 4; i++) ((uint32_t *)dst)[i] |= ((const uint32_t *)src)[i];
}

// ---- rank 0: the collectives ----

static size_t piece_len(size_t bytes, size_t c) { return bytes - c * TG_CHUNK < TG_CHUNK ? bytes - c * TG_CHUNK : TG_CHUNK; }

/* Sends rank r its result frames below `ready` until the socket is full. */
static int hub_push(ct_tcp_group *g, int r, const uint8_t *x, size_t bytes, size_t ready)
{
    peer *p = &g->peers[r];
    while (p->out_frame < ready) {
        size_t len = piece_len(bytes, p->out_frame);
        frame_hdr h = {g->op, g->seq, len};
        bool header = p->out_off < sizeof h;
        const uint8_t *src = header ? (const uint8_t *)&h + p->out_off
                                    : x + p->out_frame * TG_CHUNK + (p->out_off - sizeof h);
        size_t n = header ? sizeof h - p->out_off : sizeof h + len - p->out_off;
        if (n) {
            ssize_t k = io_move(p->fd, (void *)src, n, true);
            if (k < 0) return conn_fail(g, r);
            if (k == 0) return CT_OK;
            p->out_off += (size_t)k;
            p->last = ct_now();
        }
        if (p->out_off == sizeof h + len) p->out_frame++, p->out_off = 0;
    }
    return CT_OK;
}

/* Reads what rank r has for us: its header (checked against ours), then its
 * payload up to the end of piece `done` (the one being gathered). */
static int hub_pull(ct_tcp_group *g, int r, size_t bytes, bool up, size_t done, int *headers)
{
    peer *p = &g->peers[r];
    while (!p->hdr_ok) {
        ssize_t k = io_move(p->fd, (uint8_t *)&p->in_hdr + p->in_hdr_got, sizeof p->in_hdr - p->in_hdr_got, false);
        if (k < 0) return conn_fail(g, r);
        if (k == 0) return CT_OK;
        p->in_hdr_got += (size_t)k;
        p->last = ct_now();
        if (p->in_hdr_got < sizeof p->in_hdr) continue;
        frame_hdr mine = {g->op, g->seq, bytes};
        if (p->in_hdr.op < OP_ALLREDUCE_F32 || p->in_hdr.op > OP_BARRIER_OR)
            return set_reason(g, -1, "rank %d sent an unknown message (op %u): do all ranks run the same ctune build?",
                              r, p->in_hdr.op);
        if (memcmp(&p->in_hdr, &mine, sizeof mine) != 0) {
            char theirs[96], ours[96];
            describe(theirs, sizeof theirs, &p->in_hdr);
            describe(ours, sizeof ours, &mine);
            return set_reason(g, -1, "rank %d is in %s while rank 0 is in %s: every rank must run the same collectives "
                              "with the same sizes", r, theirs, ours);
        }
        p->hdr_ok = true;
        (*headers)++;
    }
    size_t end = up ? done * TG_CHUNK + piece_len(bytes, done) : 0;
    while (p->in_off < end) {
        uint8_t *dst = g->bufs + (size_t)(r - 1) * TG_CHUNK + (p->in_off - done * TG_CHUNK);
        ssize_t k = io_move(p->fd, dst, end - p->in_off, false);
        if (k < 0) return conn_fail(g, r);
        if (k == 0) break;
        p->in_off += (size_t)k;
        p->last = ct_now();
    }
    return CT_OK;
}

/* Rank 0's side of a collective over x[0..bytes): gathers and combines (up) or
 * only checks headers (broadcast), and sends the result back piece by piece. */
static int hub_run(ct_tcp_group *g, uint8_t *x, size_t bytes, bool up)
{
    size_t pieces = bytes ? ct_ceil_div(bytes, TG_CHUNK) : 1, done = 0;
    int headers = 0, rc = CT_OK;
    double t0 = ct_now();
    for (int r = 1; r < g->world; r++) {
        peer *p = &g->peers[r];
        *p = (peer){.fd = p->fd, .last = t0};
    }
    for (;;) {
        bool finished = true;
        double now = ct_now(), wait_s = g->timeout_s;
        for (int r = 1; r < g->world; r++) {
            peer *p = &g->peers[r];
            finished = finished && p->out_frame == pieces;
            bool want_in = !p->hdr_ok || (up && done < pieces && p->in_off < done * TG_CHUNK + piece_len(bytes, done));
            bool want_out = p->out_frame < done;
            if (want_in || want_out) {
                double left = p->last + g->timeout_s - now;
                if (left <= 0)
                    return set_reason(g, -1, "rank %d %s nothing for %g s (it hangs or is far behind)",
                                      r, want_in ? "sent" : "read", g->timeout_s);
                if (left < wait_s) wait_s = left;
            }
            short ev = (short)((want_in ? POLLIN : 0) | (want_out ? POLLOUT : 0));
            g->pfd[r] = (struct pollfd){p->out_frame == pieces ? -1 : p->fd, ev, 0};
        }
        if (finished) return CT_OK;
        if (poll(g->pfd + 1, (nfds_t)(g->world - 1), poll_ms(wait_s)) < 0 && errno != EINTR)
            return set_reason(g, -1, "poll failed: %s", strerror(errno));
        for (int r = 1; r < g->world && rc == CT_OK; r++) {
            short ev = g->pfd[r].events, rev = g->pfd[r].revents;
            if ((rev & (POLLERR | POLLHUP)) && !ev) { errno = 0; rc = conn_fail(g, r); }
            else if (rev & (POLLIN | POLLERR | POLLHUP)) rc = hub_pull(g, r, bytes, up, done, &headers);
            if (rc == CT_OK && (rev & (POLLOUT | POLLERR | POLLHUP))) rc = hub_push(g, r, x, bytes, done);
        }
        if (rc != CT_OK) return rc;
        if (headers < g->world - 1 || done == pieces) continue;
        if (up) {
            size_t off = done * TG_CHUNK, len = piece_len(bytes, done);
            bool all_in = true;
            for (int r = 1; r < g->world; r++) all_in = all_in && g->peers[r].in_off == off + len;
            if (!all_in) continue;
            /* Rank order, one rank at a time: ((x0 + x1) + x2) + ... per element. */
            for (int r = 1; r < g->world; r++) combine(g->op, x + off, g->bufs + (size_t)(r - 1) * TG_CHUNK, len);
            done++;
        } else {
            done = pieces;
        }
        /* Ranks that waited for the slowest one start a fresh clock. */
        now = ct_now();
        for (int r = 1; r < g->world; r++) g->peers[r].last = now;
        for (int r = 1; r < g->world && rc == CT_OK; r++) rc = hub_push(g, r, x, bytes, done);
        if (rc != CT_OK) return rc;
    }
}

/* After rank 0 failed: ends the frame in flight to each rank, sends it the
 * reason as an OP_ABORT frame (best effort, TG_ABORT_S at most), shuts down. */
static void hub_send_abort(ct_tcp_group *g, const uint8_t *x, size_t bytes)
{
    uint8_t msg[sizeof(frame_hdr) + sizeof g->reason];
    frame_hdr h = {OP_ABORT, g->seq, strlen(g->reason)};
    memcpy(msg, &h, sizeof h);
    memcpy(msg + sizeof h, g->reason, h.bytes);
    size_t msg_len = sizeof h + h.bytes;
    double deadline = ct_now() + (g->timeout_s < TG_ABORT_S ? g->timeout_s : TG_ABORT_S);
    for (int r = 1; r < g->world; r++) g->peers[r].abort_off = r == g->broken_rank ? msg_len : 0;
    for (;;) {
        bool pending = false;
        for (int r = 1; r < g->world; r++) {
            peer *p = &g->peers[r];
            g->pfd[r] = (struct pollfd){-1, POLLOUT, 0};
            if (p->abort_off == msg_len) continue;
            if (p->out_off > 0 && hub_push(g, r, x, bytes, p->out_frame + 1) != CT_OK) { p->abort_off = msg_len; continue; }
            while (p->out_off == 0 && p->abort_off < msg_len) {
                ssize_t k = io_move(p->fd, msg + p->abort_off, msg_len - p->abort_off, true);
                if (k <= 0) { if (k < 0) p->abort_off = msg_len; break; }
                p->abort_off += (size_t)k;
            }
            if (p->abort_off < msg_len) g->pfd[r].fd = p->fd, pending = true;
        }
        if (!pending || ct_now() >= deadline) break;
        poll(g->pfd + 1, (nfds_t)(g->world - 1), poll_ms(deadline - ct_now()));
    }
}

// ---- other ranks: the collectives ----

typedef struct leaf_in {         /* what a rank has read of rank 0's answer */
    frame_hdr hdr;
    size_t got;                  /* bytes of the current frame, header included */
    size_t total;                /* result bytes complete in x */
    bool done;
    char text[TG_REASON];        /* an abort frame's reason */
} leaf_in;

/* Reads rank 0's result frames into x (or its abort frame) until the socket is
 * empty or the result is complete. */
static int leaf_pull(ct_tcp_group *g, leaf_in *in, uint8_t *x, size_t bytes, double *last)
{
    const size_t hs = sizeof in->hdr;
    while (!in->done) {
        bool header = in->got < hs;
        size_t want = header ? hs - in->got : hs + in->hdr.bytes - in->got;
        if (want > 0) {
            uint8_t *dst = header ? (uint8_t *)&in->hdr + in->got
                                  : (in->hdr.op == OP_ABORT ? (uint8_t *)in->text : x + in->total) + (in->got - hs);
            ssize_t k = io_move(g->peers[0].fd, dst, want, false);
            if (k < 0) return conn_fail(g, 0);
            if (k == 0) return CT_OK;
            in->got += (size_t)k;
            *last = ct_now();
            bool fits = in->hdr.op == OP_ABORT ? in->hdr.bytes < sizeof in->text
                      : in->hdr.op == g->op && in->hdr.seq == g->seq && in->hdr.bytes <= bytes - in->total;
            if (header && in->got == hs && !fits)
                return set_reason(g, 0, "rank 0 sent a frame we did not expect (op %u #%u, %llu bytes): "
                                  "do all ranks run the same ctune build?",
                                  in->hdr.op, in->hdr.seq, (unsigned long long)in->hdr.bytes);
            if (in->got < hs || in->got < hs + in->hdr.bytes) continue;
        }
        if (in->hdr.op == OP_ABORT) {
            in->text[in->hdr.bytes] = '\0';
            return set_reason(g, 0, "rank 0 reports: %s", in->text);
        }
        in->total += in->hdr.bytes;
        in->got = 0;
        in->done = in->total == bytes;
    }
    return CT_OK;
}

/* Rank r's side: sends its header (and its data when up) while it reads rank
 * 0's answer. Results land only in the part of x already sent: rank 0 answers
 * a piece once it has that piece from every rank. */
static int leaf_run(ct_tcp_group *g, uint8_t *x, size_t bytes, bool up)
{
    int fd = g->peers[0].fd;
    frame_hdr req = {g->op, g->seq, bytes};
    size_t out_off = 0, out_len = sizeof req + (up ? bytes : 0);
    leaf_in in = {.done = false};
    double last = ct_now(), limit = 2 * g->timeout_s;
    while (!in.done || out_off < out_len) {
        double left = last + limit - ct_now();
        if (left <= 0) return set_reason(g, 0, "rank 0 sent nothing for %g s (it hangs or is far behind)", limit);
        struct pollfd p = {fd, (short)(POLLIN | (out_off < out_len ? POLLOUT : 0)), 0};
        if (poll(&p, 1, poll_ms(left)) < 0 && errno != EINTR) return set_reason(g, 0, "poll failed: %s", strerror(errno));
        /* Reading first: once rank 0 sent its abort, our sends may fail. */
        int rc = leaf_pull(g, &in, x, bytes, &last);
        if (rc != CT_OK) return rc;
        while (out_off < out_len) {
            bool header = out_off < sizeof req;
            uint8_t *src = header ? (uint8_t *)&req + out_off : x + (out_off - sizeof req);
            ssize_t k = io_move(fd, src, header ? sizeof req - out_off : out_len - out_off, true);
            if (k < 0) return conn_fail(g, 0);
            if (k == 0) break;
            out_off += (size_t)k;
            last = ct_now();
        }
    }
    return CT_OK;
}

/* Runs one collective on every rank; the first failure sticks to the group. */
static int group_run(ct_tcp_group *g, uint32_t op, void *x, size_t bytes, ct_error *err)
{
    if (g->failure.code != CT_OK) {
        if (err) *err = g->failure;
        return g->failure.code;
    }
    if (g->world == 1) return CT_OK;
    g->op = op;
    g->seq++;
    bool up = op != OP_BROADCAST;   /* every rank sends its data to rank 0 */
    int rc = g->rank == 0 ? hub_run(g, x, bytes, up) : leaf_run(g, x, bytes, up);
    if (rc == CT_OK) return CT_OK;
    ct_fail(&g->failure, rc, "rank %d: %s #%u: %s", g->rank, op_name(op), g->seq, g->reason);
    if (g->rank == 0) hub_send_abort(g, x, bytes);
    for (int r = 0; r < g->world; r++)
        if (g->peers[r].fd >= 0) shutdown(g->peers[r].fd, SHUT_WR);
    if (err) *err = g->failure;
    return rc;
}

int tcp_group_allreduce_sum_f32(ct_tcp_group *g, float *x, size_t n, ct_error *err)
{
    if (n > SIZE_MAX / sizeof *x) return CT_FAIL_INPUT(err, "allreduce_f32: n = %zu is too large", n);
    return group_run(g, OP_ALLREDUCE_F32, x, n * sizeof *x, err);
}

int tcp_group_allreduce_sum_f64(ct_tcp_group *g, double *x, size_t n, ct_error *err)
{
    if (n > SIZE_MAX / sizeof *x) return CT_FAIL_INPUT(err, "allreduce_f64: n = %zu is too large", n);
    return group_run(g, OP_ALLREDUCE_F64, x, n * sizeof *x, err);
}

int tcp_group_broadcast(ct_tcp_group *g, void *buf, size_t n, ct_error *err)
{
    return group_run(g, OP_BROADCAST, buf, n, err);
}

int tcp_group_barrier_or(ct_tcp_group *g, uint32_t *flags, ct_error *err)
{
    return group_run(g, OP_BARRIER_OR, flags, sizeof *flags, err);
}

// ---- forming the group ----

static void set_fast(int fd)
{
    int one = 1;   /* barriers are tiny messages: no Nagle delay */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Rank 0's listening socket, or minus the error code (err filled). */
static int hub_listen(ct_tcp_group *g, const char *addr, int port, ct_error *err)
{
    char ps[16], e[128];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res;
    int rc = getaddrinfo(addr, ps, &hints, &res);
    if (rc != 0)
        return -CT_FAIL_INPUT(err, "rank 0: cannot resolve the address '%s' to listen on: %s", addr, gai_strerror(rc));
    int fd = -1, last = 0;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) { last = errno; continue; }
        int one = 1;   /* a restarted run can take the port while old connections sit in TIME_WAIT */
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) break;
        last = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd >= 0) return fd;
    if (last == EADDRINUSE)
        return -CT_FAIL_RUNTIME(err, "rank 0: port %d on %s is already in use (an earlier run or another program holds it): "
                                "stop it or pick another MASTER_PORT on every rank", port, addr);
    return -CT_FAIL_RUNTIME(err, "rank 0: cannot listen on %s: %s", g->where, reason_of(last, e, sizeof e));
}

/* Rank 0: accepts the other ranks, checks their hellos, and answers every one
 * once all are in (or tells them it gave up). */
static int hub_gather(ct_tcp_group *g, int lfd, double timeout_s, ct_error *err)
{
    double deadline = ct_now() + timeout_s;
    int joined = 1, rc = CT_OK;
    while (joined < g->world && rc == CT_OK) {
        if (!wait_fd(lfd, POLLIN, deadline)) {
            char missing[256] = "";
            size_t len = 0;
            for (int r = 1, shown = 0; r < g->world; r++)
                if (g->peers[r].fd < 0 && len < sizeof missing - 32)
                    len += (size_t)snprintf(missing + len, sizeof missing - len, "%srank %d", shown++ ? ", " : "", r);
            if (len >= sizeof missing - 32) snprintf(missing + len, sizeof missing - len, ", ...");
            rc = CT_FAIL_RUNTIME(err, "rank 0: only %d of %d ranks connected to %s within %g s (missing: %s)",
                                 joined, g->world, g->where, timeout_s, missing);
            break;
        }
        int c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c < 0 && (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED)) continue;
        if (c < 0) {
            rc = CT_FAIL_RUNTIME(err, "rank 0: accepting a rank on %s failed: %s", g->where, strerror(errno));
            break;
        }
        hello_msg h;
        double hello_by = ct_now() + TG_HELLO_S < deadline ? ct_now() + TG_HELLO_S : deadline;
        if (io_exact(c, &h, sizeof h, false, hello_by) != 0 || h.magic != TG_MAGIC) { close(c); continue; }
        int r = (int)h.rank_or_status;
        uint32_t st = h.version != TG_VERSION ? ST_VERSION : h.world != (uint32_t)g->world ? ST_WORLD
                    : h.rank_or_status == 0 || h.rank_or_status >= (uint32_t)g->world ? ST_RANK
                    : g->peers[r].fd >= 0 ? ST_DUPLICATE : ST_OK;
        if (st == ST_OK) { set_fast(c); g->peers[r].fd = c; joined++; continue; }
        hello_msg no = {TG_MAGIC, TG_VERSION, st, (uint32_t)g->world};
        io_exact(c, &no, sizeof no, true, ct_now() + 1.0);
        close(c);
        if (st == ST_VERSION)
            rc = CT_FAIL_INPUT(err, "rank 0: a rank speaks protocol version %u, we speak %u: run the same ctune build "
                               "on every rank", h.version, TG_VERSION);
        else if (st == ST_WORLD)
            rc = CT_FAIL_INPUT(err, "rank 0: rank %u joined with world %u but rank 0's world is %d: set the same world "
                               "size on every rank", h.rank_or_status, h.world, g->world);
        else if (st == ST_RANK)
            rc = CT_FAIL_INPUT(err, "rank 0: a process joined as rank %u, out of range for world %d (ranks 1..%d "
                               "connect to rank 0)", h.rank_or_status, g->world, g->world - 1);
        else
            rc = CT_FAIL_INPUT(err, "rank 0: two processes joined as rank %d: give every process its own rank", r);
    }
    for (int r = 1; r < g->world; r++) {
        hello_msg ok = {TG_MAGIC, TG_VERSION, rc == CT_OK ? ST_OK : ST_GAVE_UP, (uint32_t)g->world};
        if (g->peers[r].fd >= 0 && io_exact(g->peers[r].fd, &ok, sizeof ok, true, ct_now() + timeout_s) != 0 && rc == CT_OK)
            rc = CT_FAIL_RUNTIME(err, "rank 0: rank %d went away before the group formed", r);
    }
    return rc;
}

/* One connection attempt by the deadline: the socket, or -1 with errno. */
static int connect_once(const struct addrinfo *ai, double deadline)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) return -1;
    int e = 0;
    socklen_t el = sizeof e;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) return fd;
    if (errno != EINPROGRESS && errno != EINTR) e = errno;
    else if (!wait_fd(fd, POLLOUT, deadline)) e = ETIMEDOUT;
    else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0) e = errno;
    if (e == 0) return fd;
    close(fd);
    errno = e;
    return -1;
}

/* Rank r > 0: connects to rank 0 (retrying while it is not up yet), says hello
 * and waits until rank 0 says the whole group is in. */
static int leaf_join(ct_tcp_group *g, const char *addr, int port, double timeout_s, ct_error *err)
{
    char ps[16], e[128];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
    int rc = getaddrinfo(addr, ps, &hints, &res);
    if (rc != 0)
        return CT_FAIL_INPUT(err, "rank %d: cannot resolve rank 0's address '%s': %s", g->rank, addr, gai_strerror(rc));
    double deadline = ct_now() + timeout_s;
    int fd = -1, last = ECONNREFUSED;
    for (;;) {
        for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next)
            if ((fd = connect_once(ai, deadline)) < 0) last = errno;
        if (fd >= 0 || ct_now() + 0.1 >= deadline) break;
        nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
    }
    freeaddrinfo(res);
    if (fd < 0)
        return CT_FAIL_RUNTIME(err, "rank %d: cannot reach rank 0 at %s within %g s (%s): is rank 0 running and "
                               "MASTER_ADDR/MASTER_PORT the same on every rank?",
                               g->rank, g->where, timeout_s, reason_of(last, e, sizeof e));
    g->peers[0].fd = fd;
    set_fast(fd);
    hello_msg h = {TG_MAGIC, TG_VERSION, (uint32_t)g->rank, (uint32_t)g->world};
    /* Rank 0 listened before we connected, so it decides within timeout_s of now. */
    double answer_by = ct_now() + timeout_s + 2.0;
    if (io_exact(fd, &h, sizeof h, true, answer_by) != 0 || (rc = io_exact(fd, &h, sizeof h, false, answer_by)) == -1)
        return CT_FAIL_RUNTIME(err, "rank %d: rank 0 at %s closed the connection before the group formed "
                               "(see rank 0's error)", g->rank, g->where);
    if (rc == -2)
        return CT_FAIL_RUNTIME(err, "rank %d: rank 0 at %s did not answer within %g s", g->rank, g->where, timeout_s + 2.0);
    if (h.magic != TG_MAGIC)
        return CT_FAIL_RUNTIME(err, "rank %d: %s is not a ctune rank 0 (bad answer to our hello)", g->rank, g->where);
    char why[160];
    switch (h.rank_or_status) {
    case ST_OK: return CT_OK;
    case ST_VERSION: snprintf(why, sizeof why, "another protocol version: run the same ctune build on every rank"); break;
    case ST_WORLD: snprintf(why, sizeof why, "our world %d differs from its world %u: set the same world size on every rank",
                            g->world, h.world); break;
    case ST_RANK: snprintf(why, sizeof why, "rank %d is out of range for world %u", g->rank, h.world); break;
    case ST_DUPLICATE: snprintf(why, sizeof why, "another process already joined as rank %d", g->rank); break;
    default:
        return CT_FAIL_RUNTIME(err, "rank %d: rank 0 at %s gave up forming the group (see rank 0's error)", g->rank, g->where);
    }
    return CT_FAIL_INPUT(err, "rank %d: rank 0 at %s refused us: %s", g->rank, g->where, why);
}

ct_tcp_group *tcp_group_open(const char *addr, int port, int rank, int world, double timeout_s, ct_error *err)
{
    if (world > 1 && !addr) { CT_FAIL_INPUT(err, "rank %d: no address for rank 0 (MASTER_ADDR)", rank); return NULL; }
    if (world < 1 || rank < 0 || rank >= world) {
        CT_FAIL_INPUT(err, "rank %d is out of range for world %d", rank, world);
        return NULL;
    }
    if (port < 1 || port > 65535 || !(timeout_s > 0)) {
        CT_FAIL_INPUT(err, "rank %d: port %d (1..65535) or timeout %g s (> 0) is out of range", rank, port, timeout_s);
        return NULL;
    }
    ct_tcp_group *g = ct_calloc(1, sizeof *g);
    g->rank = rank, g->world = world, g->timeout_s = timeout_s;
    snprintf(g->where, sizeof g->where, addr && strchr(addr, ':') ? "[%s]:%d" : "%s:%d", addr ? addr : "-", port);
    g->peers = ct_calloc((size_t)world, sizeof *g->peers);
    g->pfd = ct_calloc((size_t)world, sizeof *g->pfd);
    for (int r = 0; r < world; r++) g->peers[r].fd = -1;
    if (world == 1) return g;
    int rc;
    if (rank == 0) {
        int lfd = hub_listen(g, addr, port, err);
        if (lfd < 0) rc = -lfd;
        else {
            rc = hub_gather(g, lfd, timeout_s, err);
            close(lfd);
        }
        if (rc == CT_OK) g->bufs = ct_malloc((size_t)(world - 1) * TG_CHUNK);
    } else {
        rc = leaf_join(g, addr, port, timeout_s, err);
    }
    if (rc == CT_OK) return g;
    tcp_group_close(g);
    return NULL;
}

void tcp_group_close(ct_tcp_group *g)
{
    if (!g) return;
    for (int r = 0; r < g->world; r++)
        if (g->peers[r].fd >= 0) close(g->peers[r].fd);
    free(g->peers);
    free(g->pfd);
    free(g->bufs);
    free(g);
}

int tcp_group_rank(const ct_tcp_group *g) { return g->rank; }
int tcp_group_world(const ct_tcp_group *g) { return g->world; }

void tcp_group_set_timeout(ct_tcp_group *g, double timeout_s)
{
    CT_ASSERT(timeout_s > 0, "tcp_group_set_timeout: %g s", timeout_s);
    g->timeout_s = timeout_s;
}
