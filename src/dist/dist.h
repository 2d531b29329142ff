/* dist.h — data-parallel training: one process per GPU, each with the whole
 * model and adapter, every optimizer step's micro-batches dealt over them.
 *
 * How a step stays the step of one GPU accumulating the same micro-batches:
 *  - every rank runs the same packer, so every rank holds all of the step's
 *    micro-batches on the host and knows the step's target count without any
 *    communication: grad_scale = 1 / targets is the same everywhere;
 *  - rank r computes micro-batches i with i % world == r (dist_owns);
 *  - the LoRA gradients are summed over ranks (NCCL on the GPU's stream, or
 *    through rank 0 over TCP for the CPU backend), so every rank holds the
 *    gradient of the whole step, clips on the same global norm and takes the
 *    same AdamW update: the adapters stay equal without ever being sent.
 * Rank 0 writes metrics and checkpoints; a checkpoint does not depend on the
 * number of ranks, so a run resumes with another one.
 *
 * The ranks also meet once per step on the host (dist_agree): a stop asked of
 * any rank (SIGINT/SIGTERM) stops all after the same step, and a rank that
 * died or hangs is noticed within the timeout by the others, which then stop
 * with a message naming it. A watchdog thread ends a rank that makes no
 * progress for the timeout (stuck on the GPU or in NCCL), so no rank waits
 * forever. */
#ifndef CT_DIST_H
#define CT_DIST_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "common.h"

/* Where this process stands, from the launcher's environment: torchrun's (and
 * ctune train --gpus's) RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT;
 * else srun's SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID or Open MPI's
 * OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK} (MASTER_ADDR and MASTER_PORT still
 * name rank 0's host and port). None of them set: one process (world 1). */
typedef struct ct_dist_env {
    int rank, world, local_rank;
    char master_addr[256];
    int master_port;
    const char *launcher; /* "torchrun", "slurm", "mpi" or NULL (world 1, no launcher) */
} ct_dist_env;

/* Reads the environment into e. A malformed or inconsistent value (not an
 * integer, RANK outside [0, WORLD_SIZE), MASTER_ADDR missing when WORLD_SIZE
 * > 1, a port outside [1, 65535]) is CT_ERR_INPUT naming the variable. */
int dist_env_read(ct_dist_env *e, ct_error *err);

typedef struct ct_dist ct_dist;

/* Joins the ranks of e: the TCP group through rank 0 (every receive waits at
 * most timeout_s), then, when be has a device stream (CUDA) and NCCL is to be
 * used, an NCCL communicator over the same ranks (libnccl.so.2 loaded at run
 * time; missing: CT_ERR_RUNTIME saying so). host_reduce sums gradients through
 * rank 0's host over TCP even on CUDA (tests that put several ranks on one
 * GPU, which NCCL refuses). world 1: no sockets, no NCCL, every collective a
 * no-op. NULL + err on failure. */
ct_dist *dist_open(const ct_dist_env *e, ct_backend *be, double timeout_s, bool host_reduce, ct_error *err);
/* Leaves the group. failed: a NCCL communicator is aborted, not drained. NULL-safe. */
void dist_close(ct_dist *d, bool failed);

int dist_rank(const ct_dist *d);
int dist_world(const ct_dist *d);
/* Whether this rank computes micro-batch i (0-based) of a step. */
bool dist_owns(const ct_dist *d, size_t i);
/* "NCCL 2.x.y", "TCP through rank 0" or "one process", for the run's first note. */
const char *dist_describe(const ct_dist *d);

/* Sums the n fp32 values at device pointer x over all ranks, in place. With
 * NCCL it is queued on be's stream (no host wait); over TCP it downloads,
 * sums in rank order and uploads. */
int dist_sum_device(ct_dist *d, ct_backend *be, float *x, size_t n, ct_error *err);
/* Sums n host floats over all ranks, in place (rank order: the same bits on
 * every rank). */
int dist_sum_host(ct_dist *d, float *x, size_t n, ct_error *err);
/* Once per step, after it: sig is the signal that asked this rank to stop (0:
 * none); *stop_sig becomes, on every rank alike, SIGTERM if any rank had one,
 * else SIGINT if any had that, else 0. Also the heartbeat the watchdog and the
 * timeout see; step is named in their messages. */
int dist_agree(ct_dist *d, long long step, int sig, int *stop_sig, ct_error *err);
/* A sign of progress for the watchdog outside the collectives (an eval batch,
 * a checkpoint being written). NULL-safe. */
void dist_beat(ct_dist *d);

#endif
