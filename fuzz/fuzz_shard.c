/* fuzz_shard.c — shard_open on an arbitrary file (header, document offsets,
 * tokens, loss mask). Both CRCs are patched to match before the file is opened:
 * random bytes would otherwise stop at the CRC check, which is one comparison,
 * and never reach the offset, size and token checks behind it.
 * Invariants: no crash or leak; for a shard that opens, every document lies
 * inside the file (read here, so ASan sees any overrun), documents are not
 * empty, token ids are < vocab_size and the counts add up. */
#include <string.h>
#include <zlib.h>

#include "fuzz.h"
#include "shard.h"

#define SHARD_FUZZ_VOCAB 384   /* the tiny model's vocabulary */

int fuzz_shard(const uint8_t *data, size_t size)
{
    uint8_t *b = malloc(size ? size : 1);
    memcpy(b, data, size);
    if (size >= SHARD_HEADER_BYTES) {
        uint32_t pc = (uint32_t)crc32(0L, b + SHARD_HEADER_BYTES, (uInt)(size - SHARD_HEADER_BYTES));
        memcpy(b + 36, &pc, 4);
        uint32_t hc = (uint32_t)crc32(0L, b, 60);
        memcpy(b + 60, &hc, 4);
    }
    ct_error err;
    shard *s = shard_open(fuzz_memfile(b, size), SHARD_FUZZ_VOCAB, &err);
    free(b);
    if (!s) return 0;
    size_t tokens = 0, labels = 0;
    for (size_t d = 0; d < shard_num_docs(s); d++) {
        size_t len;
        const uint32_t *t = shard_doc_tokens(s, d, &len);
        const uint8_t *m = shard_doc_mask(s, d);
        FUZZ_ASSERT(len > 0, "document %zu is empty", d);
        for (size_t j = 0; j < len; j++) {
            FUZZ_ASSERT(t[j] < SHARD_FUZZ_VOCAB && t[j] <= shard_max_token(s), "token %u out of range", t[j]);
            labels += m[j];
        }
        tokens += len;
    }
    FUZZ_ASSERT(tokens == shard_num_tokens(s) && labels == shard_num_labels(s), "counts do not add up");
    shard_close(s);
    return 0;
}

CT_FUZZ_MAIN(fuzz_shard)
