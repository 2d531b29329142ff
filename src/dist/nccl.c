/* nccl.c — see nccl.h. NCCL's header is not needed at build time: the few
 * types are declared here as NCCL 2 defines them (ncclResult_t an int enum
 * with ncclSuccess 0, ncclFloat32 7, ncclSum 0, the unique id 128 bytes). */
#include "nccl.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NCCL_SUCCESS = 0, NCCL_FLOAT32 = 7, NCCL_SUM = 0 };

typedef struct { char internal[CT_NCCL_ID_BYTES]; } nccl_unique_id_t;
typedef void *nccl_comm_t;

struct ct_nccl {
    void *lib;
    nccl_comm_t comm;
    char version[32];
    int (*get_version)(int *version);
    int (*get_unique_id)(nccl_unique_id_t *id);
    int (*comm_init_rank)(nccl_comm_t *comm, int nranks, nccl_unique_id_t id, int rank);
    int (*all_reduce)(const void *send, void *recv, size_t count, int dtype, int op, nccl_comm_t comm, void *stream);
    int (*comm_destroy)(nccl_comm_t comm);
    int (*comm_abort)(nccl_comm_t comm);
    const char *(*error_string)(int result);
};

static int nccl_fail(ct_nccl *n, int res, const char *what, ct_error *err)
{
    return CT_FAIL_RUNTIME(err, "NCCL: %s failed: %s (HINT: every rank needs a GPU of its own: check LOCAL_RANK "
                           "and CUDA_VISIBLE_DEVICES; NCCL_DEBUG=WARN names the cause)", what, n->error_string(res));
}

ct_nccl *nccl_load(ct_error *err) { return nccl_load_from("libnccl.so.2", err); }

ct_nccl *nccl_load_from(const char *name, ct_error *err)
{
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        CT_FAIL_RUNTIME(err, "several ranks on CUDA need NCCL, which cannot be loaded (%s) (HINT: install NCCL 2, "
                        "e.g. the nvidia-nccl-cu13 wheel or the libnccl2 package, and put the folder holding "
                        "libnccl.so.2 on LD_LIBRARY_PATH)", dlerror());
        return NULL;
    }
    ct_nccl *n = ct_calloc(1, sizeof *n);
    n->lib = lib;
    struct { void **fn; const char *name; } syms[] = {
        {(void **)&n->get_version, "ncclGetVersion"},      {(void **)&n->get_unique_id, "ncclGetUniqueId"},
        {(void **)&n->comm_init_rank, "ncclCommInitRank"}, {(void **)&n->all_reduce, "ncclAllReduce"},
        {(void **)&n->comm_destroy, "ncclCommDestroy"},    {(void **)&n->comm_abort, "ncclCommAbort"},
        {(void **)&n->error_string, "ncclGetErrorString"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].fn = dlsym(lib, syms[i].name);
        if (!*syms[i].fn) {
            CT_FAIL_RUNTIME(err, "%s has no %s: not NCCL 2, or too old (HINT: install NCCL 2.12 or later)",
                            name, syms[i].name);
            dlclose(lib);
            free(n);
            return NULL;
        }
    }
    int v = 0;
    n->get_version(&v);
    /* NCCL 2.9 and later encode 2.x.y as 20000 + 100 x + y */
    snprintf(n->version, sizeof n->version, "NCCL %d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    return n;
}

const char *nccl_version(const ct_nccl *n) { return n->version; }

int nccl_unique_id(ct_nccl *n, unsigned char *id, ct_error *err)
{
    nccl_unique_id_t u;
    int res = n->get_unique_id(&u);
    if (res != NCCL_SUCCESS) return nccl_fail(n, res, "ncclGetUniqueId", err);
    memcpy(id, u.internal, CT_NCCL_ID_BYTES);
    return CT_OK;
}

int nccl_comm_init(ct_nccl *n, int world, const unsigned char *id, int rank, ct_error *err)
{
    nccl_unique_id_t u;
    memcpy(u.internal, id, CT_NCCL_ID_BYTES);
    int res = n->comm_init_rank(&n->comm, world, u, rank);
    if (res != NCCL_SUCCESS) {
        n->comm = NULL;
        return nccl_fail(n, res, "ncclCommInitRank", err);
    }
    return CT_OK;
}

int nccl_sum_f32(ct_nccl *n, float *x, size_t count, void *stream, ct_error *err)
{
    int res = n->all_reduce(x, x, count, NCCL_FLOAT32, NCCL_SUM, n->comm, stream);
    return res == NCCL_SUCCESS ? CT_OK : nccl_fail(n, res, "ncclAllReduce of the LoRA gradients", err);
}

void nccl_close(ct_nccl *n, int abort)
{
    if (!n) return;
    if (n->comm) (abort ? n->comm_abort : n->comm_destroy)(n->comm);
    dlclose(n->lib);
    free(n);
}
