/* tcp_group.h — the rank group of data-parallel training: one process per GPU,
 * joined in a star over TCP where rank 0 is the hub. Collectives are computed on
 * rank 0 in rank order, so every rank gets the same bits whatever the timing.
 *
 * Failure is the point of this module: a run on many GPUs must never hang
 * forever. A peer that closed its connection, sent nothing within the timeout or
 * entered another collective (or the same one with another size) is an error
 * (CT_ERR_RUNTIME) naming that rank and what happened; rank 0 passes its error on
 * to the other ranks, so each of them names the rank that actually failed. After
 * an error the group is unusable: every later call fails at once with the first
 * error. EINTR is retried (signal handlers without SA_RESTART are fine) and no
 * send raises SIGPIPE.
 *
 * All ranks must share one byte order (one CPU architecture): data goes raw.
 * A group is used by one thread at a time.
 * Ownership: tcp_group_open returns a handle the caller frees with tcp_group_close. */
#ifndef CT_TCP_GROUP_H
#define CT_TCP_GROUP_H

#include "common.h"

typedef struct ct_tcp_group ct_tcp_group;

/* Forms the group of `world` ranks. Rank 0 listens on addr:port (a numeric IPv4
 * or IPv6 address or a host name; SO_REUSEADDR) and waits up to timeout_s for the
 * other world-1 ranks; each of them connects, retrying every ~100 ms for up to
 * timeout_s (rank 0 may start later), and says hello with its rank and world.
 * Rank 0 refuses (CT_ERR_INPUT, on both sides) a world other than its own, a
 * rank out of range and a rank that joins twice; open returns on every rank
 * only once the whole group has joined. world == 1 opens no socket.
 * timeout_s also becomes the collectives' timeout (tcp_group_set_timeout).
 * On failure returns NULL with a one-line message naming the rank, the address
 * and what happened, e.g. "rank 1: cannot reach rank 0 at 127.0.0.1:29500
 * within 60 s (connection refused): is rank 0 running ..." or "rank 0: only 1 of
 * 2 ranks connected to 127.0.0.1:29500 within 60 s (missing: rank 1)". */
ct_tcp_group *tcp_group_open(const char *addr, int port, int rank, int world, double timeout_s, ct_error *err);
/* Closes the connections; peers then see "rank R closed its connection". NULL-safe. */
void tcp_group_close(ct_tcp_group *g);
int tcp_group_rank(const ct_tcp_group *g);
int tcp_group_world(const ct_tcp_group *g);
/* Seconds a collective waits for a peer that makes no progress (sends or reads
 * nothing) before it fails naming that peer; > 0. Ranks other than 0 wait twice
 * as long for rank 0, so that rank 0, which sees every rank, names a missing one. */
void tcp_group_set_timeout(ct_tcp_group *g, double timeout_s);

/* In-place sum of x[0..n) over all ranks, the same bits delivered to every rank:
 * rank 0 computes ((x0 + x1) + x2) + ... element by element in float, in rank
 * order. n must be equal on all ranks (a mismatch is an error naming both ranks).
 * Streams in 1 MiB pieces, so memory does not grow with n or world. */
int tcp_group_allreduce_sum_f32(ct_tcp_group *g, float *x, size_t n, ct_error *err);
/* The same in double (loss sums). */
int tcp_group_allreduce_sum_f64(ct_tcp_group *g, double *x, size_t n, ct_error *err);
/* Copies rank 0's buf[0..n) to every rank; n must be equal on all ranks. */
int tcp_group_broadcast(ct_tcp_group *g, void *buf, size_t n, ct_error *err);
/* Barrier that leaves in *flags the OR of every rank's *flags (to agree on
 * stopping at the same step). */
int tcp_group_barrier_or(ct_tcp_group *g, uint32_t *flags, ct_error *err);

#endif
