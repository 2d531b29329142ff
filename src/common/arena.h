/* arena.h — many buffers carved out of one backend allocation, in two passes
 * over the same layout code: a measuring pass (base NULL: every take returns
 * NULL and only adds up sizes), then one be->alloc of the total and a carving
 * pass that hands out the same offsets. One allocation per lifetime means no
 * fragmentation and a plan that is exact by construction: the bytes printed
 * before step 1 are the bytes allocated. */
#ifndef CT_ARENA_H
#define CT_ARENA_H

#include <stddef.h>

/* 256 bytes: what cudaMalloc guarantees, enough for every vectorised access. */
#define CT_ARENA_ALIGN 256

typedef struct ct_arena {
    char *base;   /* NULL while measuring */
    size_t used;
} ct_arena;

static inline void *arena_take(ct_arena *a, size_t bytes)
{
    void *p = a->base ? a->base + a->used : NULL;
    a->used += (bytes + CT_ARENA_ALIGN - 1) & ~(size_t)(CT_ARENA_ALIGN - 1);
    return p;
}

#endif
