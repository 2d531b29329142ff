/* fuzz_safetensors.c — st_open on an arbitrary file (8-byte header length, JSON
 * header, tensor data). Invariants: no crash or leak; every tensor of a file that
 * opens has its bytes inside the mapping (read here, so ASan sees any overrun),
 * nbytes == numel * dtype size, and st_find finds it by name. */
#include <string.h>

#include "fuzz.h"
#include "safetensors.h"

static volatile unsigned st_fuzz_sink; /* keeps the reads of tensor bytes from being optimized away */

int fuzz_safetensors(const uint8_t *data, size_t size)
{
    ct_error err;
    st_reader *r = st_open(fuzz_memfile(data, size), &err);
    if (!r) return 0;
    unsigned sum = 0;
    for (size_t i = 0; i < st_count(r); i++) {
        const st_tensor *t = st_at(r, i);
        size_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= (size_t)t->shape[d];
        FUZZ_ASSERT(numel == t->numel && t->nbytes == numel * ct_dtype_size(t->dtype), "tensor %zu: bad sizes", i);
        const unsigned char *p = t->data;
        for (size_t b = 0; b < t->nbytes; b++) sum += p[b];
        FUZZ_ASSERT(st_find(r, t->name) == t, "tensor %zu not found by name", i);
    }
    st_metadata(r, "format");
    st_close(r);
    st_fuzz_sink = sum;
    return 0;
}

CT_FUZZ_MAIN(fuzz_safetensors)
