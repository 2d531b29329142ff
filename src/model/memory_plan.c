/* memory_plan.c — see memory_plan.h.
 *
 * Free memory: the CUDA backend's is what cudaMemGetInfo reports. The CPU
 * backend's is host memory, and its "device" and offloaded inputs share it: the
 * least of MemAvailable and what RLIMIT_AS / RLIMIT_DATA still allow this
 * process (ulimit -v / -d), three quarters of it for the plan. A micro-batch
 * that does not fit is refused with the largest one that does: fitting is
 * monotone in the token count (every buffer grows with it), so a binary search
 * over the real plan (choose_layout, with the run's own memory settings) finds
 * it, and the run at that size takes the same path. */
#include "memory_plan.h"

#include <stdint.h>
#include <string.h>
#include <sys/resource.h>

static size_t round256(size_t b) { return (b + 255) & ~(size_t)255; }
static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }
static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

/* memory.gpu_memory_limit in bytes (0: none). */
static size_t limit_bytes(const ct_memory_config *mem)
{
    return mem->gpu_memory_limit > 0 ? (size_t)(mem->gpu_memory_limit * (double)((size_t)1 << 30)) : 0;
}

static bool is_expert_module(const ct_model_config *c, int mod)
{
    return c->num_experts > 0 && (mod == CT_MOD_GATE || mod == CT_MOD_UP || mod == CT_MOD_DOWN);
}

/* The CPU ops allocate their scratch per call (backend_cpu*.c); the largest of
 * those requests, each an upper bound over T tokens:
 *   lora          u and g (T,R) fp32; with dropout drop(x) and g A (T,in); the
 *                 experts' over T*K rows, plus one expert's gathered rows
 *   rope backward a (T, nq*D) copy of dy; attention backward Delta (T,nq)
 *   cross-entropy 64 rows of (H) inputs and (V) logits
 *   experts       router softmax (T,E), activations (T*K, I), gathered rows (T*K, H) */
static size_t cpu_workspace(const ct_model *m, const ct_lora *lo, size_t T)
{
    const ct_model_config *c = &m->cfg;
    size_t H = c->hidden_size, V = c->vocab_size, nq = c->num_attention_heads, D = c->head_dim, need = 0;
    size_t TK = T * (size_t)(c->num_experts > 0 ? c->num_experts_per_tok : 1);
    for (int mod = 0; lo && mod < CT_MOD_COUNT; mod++) {
        if (!lo->targeted[mod]) continue;
        int in, out;
        model_module_shape(c, mod, &in, &out);
        size_t rows = is_expert_module(c, mod) ? TK : T;
        size_t b = rows * 2 * (size_t)lo->R + (lo->dropout > 0 ? 2 * rows * (size_t)in : 0) +
                   (is_expert_module(c, mod) ? rows * (size_t)in : 0);
        need = max_sz(need, b * 4);
    }
    need = max_sz(need, T * nq * max_sz(D, 1) * 4);
    need = max_sz(need, 64 * (H + V) * 4);
    if (c->num_experts > 0)
        need = max_sz(need, max_sz(T * c->num_experts, TK * max_sz(H, c->moe_intermediate_size)) * 4);
    return need + ((size_t)1 << 20);
}

/* Mirrors the CUDA ops' cuda_scratch requests, each an upper bound over the
 * micro-batch (T tokens, at most T documents and T targets); the largest one is
 * what the scratch must hold, since scratch lives for one op (the CPU's: see
 * cpu_workspace):
 *   linear_lora.cu       bf16 A and B, u and g (T,R), drop(x) (T,in) with dropout; modules
 *                 that share an input as one LoRA (lora_fwd_cols): its stacked A,
 *                 block-diagonal B^T, u and g (T,RP) and fp32 dA (RP,in)
 *   loss.cu       per-row losses, a (chunk,V) fp32 + bf16 logits chunk sized by
 *                 its 256 MiB logits budget but no more rows than T (padded to
 *                 64) or 65472 (a small vocabulary would otherwise ask for
 *                 millions of rows), (chunk,H) gathers
 *   attention     2 (T,nq) fp32 rows in backward + the tile list (24 B/token)
 *   gdn_delta.cu  the delta rule's backward (delta_carve): per token fp32 q, k
 *                 norms (2 Hk Dk), chunk matrices (3 Hv 64), W (Hv Dk), U', u,
 *                 db (3 Hv Dv), column-tile partials of dq, dk (2 Hv Dk Dv/32) and
 *                 of dg, dbeta; two states of Hv Dk Dv per 64 tokens; the chunk
 *                 table for up to one document per token
 *   moe_expert_lora.cu   as linear_lora.cu over T*K expert rows, plus the padded bf16 masters
 *   (moe_gemm_fused_lora.cu) of every expert and one backward chunk's u and g */
size_t memory_plan_workspace(const ct_model *m, const ct_lora *lo, int capacity)
{
    if (!strcmp(m->be->name, "cpu")) return cpu_workspace(m, lo, (size_t)capacity);
    if (strcmp(m->be->name, "cuda") != 0) return 0;
    const ct_model_config *c = &m->cfg;
    size_t T = capacity, H = c->hidden_size, V = c->vocab_size, nq = c->num_attention_heads;
    size_t need = 0;
    for (int mod = 0; lo && mod < CT_MOD_COUNT; mod++) {
        if (!lo->targeted[mod]) continue;
        int in, out;
        model_module_shape(c, mod, &in, &out);
        size_t rows = T;
        if (is_expert_module(c, mod)) rows = T * (size_t)c->num_experts_per_tok; /* expert LoRA runs over routed rows */
        size_t R = lo->R, b = round256(R * in * 2) + round256(out * R * 2) + 2 * round256(rows * R * 2);
        if (c->num_experts > 0) {
            /* the largest expert-LoRA request: gate and up's backward as one LoRA
             * of rank 2R (moe_lora_bwd_cols) with A, A^T and B^T padded to RP
             * ranks over in and 2 out, u and g of one row chunk (8 MiB), the tile
             * list; it also bounds the fused forward's and the one-module ops'.
             * Or the input gradient's stacked A, (E, 64, in), which reuses it. */
            size_t rp = 2 * R <= 16 ? 16 : 2 * R <= 32 ? 32 : 64, E = c->num_experts;
            b += max_sz(round256(E * rp * (2 * (size_t)in + 2 * (size_t)out) * 2) + ((size_t)8 << 20) +
                            round256(rows * 16),
                        round256(E * 64 * (size_t)in * 2));
        }
        if (lo->dropout > 0) b += round256(rows * in * 2);
        need = max_sz(need, b);
    }
    if (lo) { /* the stacked LoRA of q, k, v (or of gate and up): at most 3 modules of the widest span */
        size_t rp = (CT_LORA_COLS_MAX * (size_t)lo->R + 7) / 8 * 8, I = c->intermediate_size;
        size_t span = max_sz((size_t)(nq + 2 * c->num_key_value_heads) * c->head_dim, 2 * I);
        need = max_sz(need, round256(rp * H * 2) + round256(rp * span * 2) + 2 * round256(T * rp * 2) +
                                round256(rp * H * 4));
    }
    size_t fit = ((size_t)256 << 20) / (V * 4), chunk = fit < 64 ? 64 : fit / 64 * 64;
    chunk = min_sz(chunk, min_sz(ct_ceil_div(T, 64) * 64, 65535 / 64 * 64));
    need = max_sz(need, round256(T * 4) + 2 * round256(chunk * H * 2) + round256(chunk * V * 4) +
                            round256(chunk * V * 2));
    need = max_sz(need, 2 * round256(T * nq * 4) + round256(24 * T + 64));
    if (c->gdn) {
        size_t Hk = c->linear_num_key_heads, Hv = c->linear_num_value_heads, Dk = c->linear_key_head_dim;
        size_t Dv = c->linear_value_head_dim, nt = Dv / 32, states = T / 64 > 0 ? T / 64 : 1;
        need = max_sz(need, round256((T / 64 + T) * 16) + round256((T + 1) * 4) + 2 * round256(T * Hk * Dk * 4) +
                                3 * round256(T * Hv * 64 * 4) + round256(T * Hv * Dk * 4) +
                                3 * round256(T * Hv * Dv * 4) + round256(T * Hv * 4) +
                                2 * round256(states * Hv * Dk * Dv * 4) + 2 * round256(nt * T * Hv * Dk * 4) +
                                2 * round256(nt * T * Hv * 4));
    }
    for (int l = 0; m->fp8_weights && m->qlayers && l < c->num_hidden_layers; l++) {
        /* the FP8 GEMMs (fp8.cu): the quantized input and its scales, and for the
         * input gradient W^T and its block grid too */
        const ct_qweight *q = (const ct_qweight *)&m->qlayers[l];
        for (size_t i = 0; i < sizeof(ct_layer_qweights) / sizeof(ct_qweight); i++) {
            if (!q[i].fp8 || !q[i].codes) continue;
            size_t in = q[i].cols, out = q[i].rows, gi = (in + 127) / 128, go = (out + 127) / 128;
            /* the quantized rows, and the last 1-3 rows padded to 4 with their output */
            size_t fwd = round256(T * in) + round256(gi * T * 4) + round256(4 * in) + round256(gi * 16) +
                         round256(8 * ((out + 7) / 8 * 8));
            size_t bwd = round256(in * out) + round256(gi * ((go + 3) / 4 * 4) * 4) + round256(T * out) +
                         round256(go * T * 4) + round256(4 * out) + round256(go * 16) +
                         round256(8 * ((in + 7) / 8 * 8));
            need = max_sz(need, max_sz(fwd, bwd));
        }
    }
    return need + ((size_t)1 << 20);
}

/* Fills p for opt; returns whether the device part fits (p->fits: both parts). */
static bool fill(ct_memory_plan *p, const ct_model *m, const ct_lora *lo, const ct_graph_options *opt)
{
    p->opt = *opt;
    p->layers = m->cfg.num_hidden_layers;
    graph_measure(m, opt, &p->graph);
    p->weights = m->weight_bytes;
    p->lora_optim = lo ? lo->n_params * 4 * sizeof(float) : 0;
    p->workspace = memory_plan_workspace(m, lo, opt->capacity);
    size_t graph_dev = p->graph.saved_device + p->graph.staging + p->graph.working + p->graph.batch;
    p->device_total = p->weights + p->lora_optim + graph_dev + p->workspace;
    bool shared = p->host_available == CT_PLAN_SHARED;
    size_t need = graph_dev + p->workspace + (shared ? p->graph.host : 0);
    bool dev = p->available == SIZE_MAX || need <= p->available;
    p->fits = dev && (shared || p->host_available == SIZE_MAX || p->graph.host <= p->host_available);
    return dev;
}

/* Offload with `buffers` staging buffers: the fewest layers (from layer 0) whose
 * device part fits; device memory falls and host memory grows with their
 * number, so that is the only candidate worth checking against the host. */
static bool fewest_offloaded(ct_memory_plan *p, const ct_model *m, const ct_lora *lo, ct_graph_options o, int buffers)
{
    int L = m->cfg.num_hidden_layers;
    o.offload_buffers = buffers;
    o.offload_layers = L;
    if (!fill(p, m, lo, &o)) return false;
    int lo_k = 1, hi_k = L;
    while (lo_k < hi_k) {
        o.offload_layers = lo_k + (hi_k - lo_k) / 2;
        if (fill(p, m, lo, &o)) hi_k = o.offload_layers;
        else lo_k = o.offload_layers + 1;
    }
    o.offload_layers = hi_k;
    fill(p, m, lo, &o);
    return p->fits;
}

/* memory.checkpoint_layers auto: the most layers (the last ones) that keep their
 * intermediates while the device part fits without offload, or 0. Memory grows
 * with their number, so a binary search finds it. */
static int most_kept_layers(ct_memory_plan *p, const ct_model *m, const ct_lora *lo, ct_graph_options o)
{
    int good = 0, lo_k = 1, hi_k = m->cfg.num_hidden_layers;
    while (lo_k <= hi_k) {
        o.keep_layers = lo_k + (hi_k - lo_k) / 2;
        if (fill(p, m, lo, &o)) good = o.keep_layers, lo_k = o.keep_layers + 1;
        else hi_k = o.keep_layers - 1;
    }
    return good;
}

/* Whether lo adapts the experts of a sparse layer (gate_proj, up_proj or down_proj
 * on a mixture-of-experts model). */
static bool experts_adapted(const ct_model *m, const ct_lora *lo)
{
    return lo && m->cfg.num_experts > 0 &&
           (lo->targeted[CT_MOD_GATE] || lo->targeted[CT_MOD_UP] || lo->targeted[CT_MOD_DOWN]);
}

/* The first layout that fits with MLP chunks of `chunk` tokens, in the order
 * `mode` prefers; false if none. With checkpoint_layers auto (and offload not
 * forced on), keeping the last layers' intermediates comes before offloading:
 * it saves recompute time, offload only frees memory. */
static bool choose_layout_at(ct_memory_plan *p, const ct_model *m, const ct_lora *lo, const ct_memory_config *mem,
                             int capacity, int chunk)
{
    int L = m->cfg.num_hidden_layers, max_buffers = mem->offload_buffers == 1 ? 1 : 2;
    ct_graph_options o = {.capacity = capacity, .checkpointing = mem->gradient_checkpointing,
                          .mlp_chunk = mem->gradient_checkpointing ? chunk : 0,
                          .lora_rank = lo ? lo->R : 0, .no_expert_lora = !experts_adapted(m, lo)};
    if (o.checkpointing && mem->checkpoint_layers == CT_CKPT_AUTO && mem->activation_offload != CT_TRI_ON) {
        o.keep_layers = most_kept_layers(p, m, lo, o);
        fill(p, m, lo, &o);
        if (o.keep_layers > 0) return p->fits;
    }
    if (!o.checkpointing || mem->activation_offload == CT_TRI_OFF) {
        fill(p, m, lo, &o);
        return p->fits;
    }
    if (mem->activation_offload == CT_TRI_AUTO) {
        fill(p, m, lo, &o);
        if (p->fits) return true;
        if (fewest_offloaded(p, m, lo, o, max_buffers)) return true;
        return max_buffers == 2 && fewest_offloaded(p, m, lo, o, 1);
    }
    o.offload_layers = L;
    o.offload_buffers = max_buffers;
    fill(p, m, lo, &o);
    if (p->fits || max_buffers == 1) return p->fits;
    o.offload_buffers = 1;
    fill(p, m, lo, &o);
    return p->fits;
}

/* choose_layout_at with CT_MLP_CHUNK_TOKENS, and with checkpointing, when
 * nothing fits, with chunks half as long each time down to
 * CT_MLP_CHUNK_TOKENS_MIN: the (chunk, 2I) intermediates are the one part of the
 * working set that does not grow with the micro-batch, so the largest chunk that
 * fits is taken (longer chunks keep the GEMMs larger). */
static bool choose_layout(ct_memory_plan *p, const ct_model *m, const ct_lora *lo, const ct_memory_config *mem,
                          int capacity)
{
    for (int chunk = CT_MLP_CHUNK_TOKENS;; chunk /= 2) {
        if (choose_layout_at(p, m, lo, mem, capacity, chunk)) return true;
        if (!mem->gradient_checkpointing || chunk / 2 < CT_MLP_CHUNK_TOKENS_MIN || chunk / 2 >= capacity) return false;
    }
}

/* The largest micro-batch in [1, hi] whose plan fits under mem, or 0. */
static int largest_fitting(ct_memory_plan *probe, const ct_model *m, const ct_lora *lo, const ct_memory_config *mem,
                           int hi)
{
    int good = 0, lo_t = 1;
    while (lo_t <= hi) {
        int mid = lo_t + (hi - lo_t) / 2;
        if (choose_layout(probe, m, lo, mem, mid)) good = mid, lo_t = mid + 1;
        else hi = mid - 1;
    }
    return good;
}

int memory_plan_choose(const ct_model *m, const ct_lora *lo, const ct_memory_config *mem, int capacity,
                       size_t available, size_t host_available, ct_memory_plan *plan, ct_error *err)
{
    memset(plan, 0, sizeof *plan);
    plan->backend = m->be->name;
    plan->available = available;
    plan->host_available = host_available;
    plan->device_limit = host_available == CT_PLAN_SHARED ? 0 : limit_bytes(mem);
    if (mem->activation_offload == CT_TRI_ON && !mem->gradient_checkpointing)
        return CT_FAIL_INPUT(err, "memory.activation_offload: on needs memory.gradient_checkpointing: true "
                             "(offload moves the saved layer inputs, which exist only with checkpointing)");
    if (choose_layout(plan, m, lo, mem, capacity)) return CT_OK;

    /* Does not fit: the largest micro-batch that fits with these settings, and
     * with every saving on when some is off. */
    ct_memory_config best = {.gradient_checkpointing = true, .checkpoint_layers = mem->checkpoint_layers,
                             .activation_offload = CT_TRI_AUTO, .offload_buffers = 2};
    bool savings_off = !mem->gradient_checkpointing || mem->activation_offload == CT_TRI_OFF ||
                       mem->offload_buffers == 1;
#define SAVINGS "memory.gradient_checkpointing: true, memory.activation_offload: auto and memory.offload_buffers: 2"
    ct_memory_plan probe = *plan;
    char fix[320];
    int good = largest_fitting(&probe, m, lo, mem, capacity - 1);
    int good_best = savings_off ? largest_fitting(&probe, m, lo, &best, capacity) : good;
    int n = good > 0 ? snprintf(fix, sizeof fix, "the largest data.tokens_per_micro_batch that fits is %d", good)
                     : snprintf(fix, sizeof fix, "no data.tokens_per_micro_batch fits with these memory settings");
    if (good_best > good)
        snprintf(fix + n, sizeof fix - (size_t)n, " (%d with " SAVINGS ")", good_best);
    else if (good == 0)
        snprintf(fix, sizeof fix, "not even 1 token fits: the weights and LoRA state alone leave too little (use %s)",
                 host_available == CT_PLAN_SHARED ? "a machine with more memory"
                 : plan->device_limit             ? "a higher memory.gpu_memory_limit or a larger GPU"
                                                  : "a larger GPU");
#undef SAVINGS
    double gib = 1.0 / (1 << 30);
    if (host_available != CT_PLAN_SHARED && host_available != SIZE_MAX && plan->graph.host > host_available)
        return CT_FAIL_INPUT(err, "memory plan: %d tokens per micro-batch need %.2f GiB of host memory for "
                             "offloaded activations, %.2f GiB available; %s",
                             capacity, plan->graph.host * gib, host_available * gib, fix);
    size_t need = plan->device_total - plan->weights - plan->lora_optim +
                  (host_available == CT_PLAN_SHARED ? plan->graph.host : 0);
    char limit[96] = "";
    if (plan->device_limit)
        snprintf(limit, sizeof limit, " under memory.gpu_memory_limit (%g GiB)", mem->gpu_memory_limit);
    return CT_FAIL_INPUT(err, "memory plan: %d tokens per micro-batch need %.2f GiB of %s memory for activations "
                         "and workspace, %.2f GiB available after weights and LoRA%s; %s",
                         capacity, need * gib, plan->backend, available * gib, limit, fix);
}

/* What can be read from /proc/self/status FIELD ("VmSize:"), in bytes, or 0. */
static size_t proc_status_bytes(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kib = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, strlen(field)) && sscanf(line + strlen(field), " %zu kB", &kib) == 1) break;
    fclose(f);
    return kib * 1024;
}

/* What is left under a resource limit given the process's use, or SIZE_MAX. */
static size_t rlimit_left(int resource, const char *status_field)
{
    struct rlimit rl;
    if (getrlimit(resource, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return SIZE_MAX;
    size_t used = proc_status_bytes(status_field);
    return rl.rlim_cur > used ? (size_t)(rl.rlim_cur - used) : 0;
}

/* The least of MemAvailable (/proc/meminfo) and what RLIMIT_AS and RLIMIT_DATA
 * leave this process; SIZE_MAX when none of them is known. */
static size_t host_memory_available(void)
{
    size_t avail = SIZE_MAX, kib = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %zu kB", &kib) == 1) {
                avail = kib * 1024;
                break;
            }
        fclose(f);
    }
    avail = min_sz(avail, rlimit_left(RLIMIT_AS, "VmSize:"));
    return min_sz(avail, rlimit_left(RLIMIT_DATA, "VmData:"));
}

size_t memory_plan_device_budget(size_t free, size_t limit, size_t held)
{
    size_t avail = free > CT_PLAN_MARGIN ? free - CT_PLAN_MARGIN : 0;
    if (limit == 0) return avail;
    size_t under = limit > held + CT_PLAN_MARGIN ? limit - held - CT_PLAN_MARGIN : 0;
    return min_sz(avail, under);
}

int memory_plan_make(const ct_model *m, const ct_lora *lo, const ct_memory_config *mem, int capacity,
                     ct_memory_plan *plan, ct_error *err)
{
    ct_backend *be = m->be;
    size_t host = host_memory_available();
    /* leave the host a quarter of what is free for everything else (data, page cache) */
    if (host != SIZE_MAX) host -= host / 4;
    if (!be->memory_free) {
        if (mem->gpu_memory_limit > 0)
            fprintf(stderr, "note: memory.gpu_memory_limit (%g GiB) applies to a GPU; the %s backend plans host "
                    "memory and ignores it\n", mem->gpu_memory_limit, be->name);
        return memory_plan_choose(m, lo, mem, capacity, host, CT_PLAN_SHARED, plan, err);
    }
    size_t held = m->weight_bytes + (lo ? lo->n_params * 4 * sizeof(float) : 0);
    size_t avail = memory_plan_device_budget(be->memory_free(be), limit_bytes(mem), held);
    return memory_plan_choose(m, lo, mem, capacity, avail, host, plan, err);
}

/* "1.23 GiB" or "45.6 MiB": tiny models stay readable. */
static const char *size_str(char *buf, size_t len, size_t bytes)
{
    if (bytes >= ((size_t)1 << 30)) snprintf(buf, len, "%7.2f GiB", (double)bytes / (1 << 30));
    else snprintf(buf, len, "%7.1f MiB", (double)bytes / (1 << 20));
    return buf;
}

void memory_plan_print(const ct_memory_plan *p, FILE *f)
{
    const ct_graph_options *o = &p->opt;
    char b[32], h[32];
    fprintf(f, "memory plan (%s, %d tokens per micro-batch):\n", p->backend, o->capacity);
    fprintf(f, "  weights              %s\n", size_str(b, sizeof b, p->weights));
    fprintf(f, "  LoRA + optimizer     %s  (parameters, gradients, 2 AdamW moments)\n",
            size_str(b, sizeof b, p->lora_optim));
    fprintf(f, "  saved layer inputs   %s  %s\n", size_str(b, sizeof b, p->graph.saved_device),
            o->checkpointing ? "(checkpointing: layer inputs only)" : "(no checkpointing: every intermediate)");
    if (o->offload_layers > 0)
        fprintf(f, "  offload staging      %s  (%d buffer%s; inputs of layers 0-%d in host memory: %s)\n",
                size_str(b, sizeof b, p->graph.staging), o->offload_buffers,
                o->offload_buffers == 1 ? ", copies not overlapped" : "s", o->offload_layers - 1,
                size_str(h, sizeof h, p->graph.host));
    fprintf(f, "  layer working set    %s", size_str(b, sizeof b, p->graph.working));
    if (o->checkpointing && o->mlp_chunk > 0 && o->mlp_chunk < o->capacity)
        fprintf(f, "  (MLP in chunks of %d tokens)", o->mlp_chunk);
    if (o->checkpointing && o->keep_layers > 0) {
        int L = p->layers, first = L - (o->keep_layers < L ? o->keep_layers : L);
        fprintf(f, "  (layers %d-%d keep their intermediates; %s)", first, L - 1,
                first > 0 ? "the others are recomputed in backward" : "none is recomputed");
    }
    fprintf(f, "\n  op workspace         %s\n", size_str(b, sizeof b, p->workspace));
    fprintf(f, "  batch metadata       %s\n", size_str(b, sizeof b, p->graph.batch));
    fprintf(f, "  total %-14s %s", strcmp(p->backend, "cpu") ? "on the device" : "(host memory)",
            size_str(b, sizeof b, p->device_total));
    char limit[64] = "";
    if (p->device_limit)
        snprintf(limit, sizeof limit, "; memory.gpu_memory_limit %.2f GiB", (double)p->device_limit / (1 << 30));
    if (p->available != SIZE_MAX)
        fprintf(f, "  (%s available for activations and workspace%s: %s)\n", size_str(h, sizeof h, p->available),
                limit, p->fits ? "fits" : "does NOT fit");
    else
        fprintf(f, "\n");
    fflush(f); /* before the training log, which the user reads next */
}
