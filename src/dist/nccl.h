/* nccl.h — NCCL, loaded at run time (dlopen of libnccl.so.2), so a single-GPU
 * build has no NCCL dependency and a machine without it fails only when
 * several ranks are asked for, with a message saying what to install. Only
 * what data-parallel LoRA needs: a communicator from a unique id that rank 0
 * makes and the others receive (over dist.c's TCP group), and an fp32 sum
 * all-reduce queued on a CUDA stream. */
#ifndef CT_NCCL_H
#define CT_NCCL_H

#include <stddef.h>

#include "common.h"

#define CT_NCCL_ID_BYTES 128 /* sizeof(ncclUniqueId) */

typedef struct ct_nccl ct_nccl;

/* Loads libnccl.so.2 (the dynamic loader's search path: LD_LIBRARY_PATH,
 * then the system's). NULL + CT_ERR_RUNTIME when it is missing or lacks a
 * function ctune calls. */
ct_nccl *nccl_load(ct_error *err);
/* The same from the library `name` (tests: one that does not exist). */
ct_nccl *nccl_load_from(const char *name, ct_error *err);
/* "NCCL 2.21.5". */
const char *nccl_version(const ct_nccl *n);
/* Rank 0: a new unique id into id[CT_NCCL_ID_BYTES]. */
int nccl_unique_id(ct_nccl *n, unsigned char *id, ct_error *err);
/* Joins the communicator of `world` ranks named by id, on the current CUDA
 * device; blocks until every rank has joined. */
int nccl_comm_init(ct_nccl *n, int world, const unsigned char *id, int rank, ct_error *err);
/* Queues x[0..count) summed over the ranks, in place, on stream (a cudaStream_t). */
int nccl_sum_f32(ct_nccl *n, float *x, size_t count, void *stream, ct_error *err);
/* Destroys the communicator (abort: without waiting for queued work, for a
 * run that failed) and unloads the library. NULL-safe. */
void nccl_close(ct_nccl *n, int abort);

#endif
