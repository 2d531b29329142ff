/* fuzz_model_config.c — a Hugging Face config.json (model_config_parse) on
 * arbitrary bytes, then everything derived from an accepted config: the tensor
 * list and its shapes, parameter counts and the RoPE frequencies.
 * Invariants: no crash, leak, overflow (UBSan) or runaway allocation, whatever
 * sizes the file claims; every shape of an accepted config is positive. */
#include <string.h>

#include "fuzz.h"
#include "model_config.h"

int fuzz_model_config(const uint8_t *data, size_t size)
{
    ct_error err;
    ct_model_config *mc = malloc(sizeof *mc);
    if (model_config_parse(mc, (const char *)data, size, "config.json", &err) == CT_OK) {
        size_t n, total = 0;
        ct_tensor_spec *specs = model_tensor_specs(mc, &n);
        for (size_t i = 0; i < n; i++) {
            size_t numel = 1;
            for (int d = 0; d < specs[i].ndim; d++) {
                FUZZ_ASSERT(specs[i].shape[d] > 0, "%s: dimension %d is %lld", specs[i].name, d,
                            (long long)specs[i].shape[d]);
                FUZZ_ASSERT(!__builtin_mul_overflow(numel, (size_t)specs[i].shape[d], &numel),
                            "%s: element count overflows", specs[i].name);
            }
            FUZZ_ASSERT(!__builtin_add_overflow(total, numel, &total), "parameter count overflows");
        }
        free(specs);
        ct_param_counts c = model_param_counts(mc);
        FUZZ_ASSERT(c.total == total && c.total >= c.embedding, "parameter counts do not add up");
        int rd = model_rope_dim(mc);
        FUZZ_ASSERT(rd > 0 && rd <= mc->head_dim && rd % 2 == 0, "rotary dim %d", rd);
        float *inv = malloc((size_t)rd / 2 * sizeof *inv), scaling;
        model_rope_inv_freq(mc, inv, &scaling);
        free(inv);
    }
    free(mc);
    return 0;
}

CT_FUZZ_MAIN(fuzz_model_config)
