/* backend_cpu_gdn.h — the CPU reference of the ops a Gated DeltaNet (GDN) hybrid
 * model needs (Qwen3.5, Qwen3-Next), fp32: the causal conv1d + SiLU, the decay
 * and write gates, the gated delta rule, the gated RMSNorm of a GDN layer's
 * output and the sigmoid output gate of a gated full-attention layer. Each has a
 * forward and a backward to its activation inputs; conv weights, A_log, dt_bias
 * and norm weights are frozen (no weight gradients).
 *
 * Conventions are backend.h's: row-major, ld* the token (row) stride in
 * elements, act tensors fp32 here. be is unused on the CPU (kept first, as in the
 * op table). Backward outputs are overwritten, never accumulated. Every output
 * element is computed by one thread in a fixed order, so results do not depend
 * on the number of OpenMP threads. Dimension names: T tokens, C channels, W conv
 * width, Hk key heads, Hv value heads (Hv a multiple of Hk: value head h uses
 * key head h / (Hv/Hk)), Dk key head dim, Dv value head dim, nh heads, D head dim. */
#ifndef CT_BACKEND_CPU_GDN_H
#define CT_BACKEND_CPU_GDN_H

#include "backend.h"

/* Causal depthwise conv1d + SiLU over C channels, width W (1..8), per document:
 *   y[t,c] = silu( sum_{j=0}^{W-1} w[c*W + j] * x[t-(W-1-j), c] )
 * where the tap at distance d = W-1-j counts only when d <= pos[t] (pos = position
 * inside the document, restarting at 0 at each document start: taps before the
 * document's first token are zero). x (T,C) with row stride ldx, y (T,C) ldy, w (C,W)
 * (HF's conv1d.weight (C,1,W) squeezed); pos (T) int32 with 0 <= pos[t] <= t (asserted).
 * y must not alias x. */
void cpu_gdn_conv_fwd(ct_backend *be, float *y, int ldy, const float *x, int ldx, const float *w,
                      const int32_t *pos, int T, int C, int W);
/* Its backward to the input (the conv weight is frozen): dx (T,C) overwritten,
 *   dx[t,c] = sum_d w[c*W + W-1-d] * dp[t+d, c],   dp = dy * silu'(pre-activation),
 * over the d in [0, W) for which the forward counted that tap: t + d < T and
 * d <= pos[t+d]. With positions that restart at 0 and count up by one inside a
 * document this is pos[t+d] == pos[t] + d: token t+d feeds from t only inside t's
 * document. dx must not alias dy or x. */
void cpu_gdn_conv_bwd(ct_backend *be, float *dx, int lddx, const float *dy, int lddy, const float *x, int ldx,
                      const float *w, const int32_t *pos, int T, int C, int W);

/* The gates, fp32: beta[t,h] = sigmoid(b[t,h]); g[t,h] = -exp(A_log[h]) * softplus(a[t,h] + dt_bias[h]),
 * softplus as torch's (x when x > 20, else log1p(exp(x))). a, b (T,Hv) with row strides; g, beta (T,Hv)
 * dense; A_log, dt_bias (Hv). g <= 0 always. */
void cpu_gdn_gates_fwd(ct_backend *be, float *g, float *beta, const float *a, int lda, const float *b, int ldb,
                       const float *A_log, const float *dt_bias, int T, int Hv);
/* Backward: da, db (overwritten) from dg, dbeta (T,Hv) dense:
 *   da = dg * -exp(A_log) * softplus'(a + dt_bias)  (softplus' = 1 when x > 20, as torch, else sigmoid(x))
 *   db = dbeta * beta (1 - beta).
 * A_log and dt_bias are frozen. */
void cpu_gdn_gates_bwd(ct_backend *be, float *da, int ldda, float *db, int lddb, const float *dg, const float *dbeta,
                       const float *a, int lda, const float *b, int ldb, const float *A_log, const float *dt_bias,
                       int T, int Hv);

/* The gated delta rule with q/k L2 norm inside, per document d (tokens [cu_seqlens[d], cu_seqlens[d+1]))
 * and value head h, whose key head is h / (Hv / Hk) (Hv a multiple of Hk):
 *   qn = q * rsqrt(sum(q^2) + 1e-6) * scale ; kn = k * rsqrt(sum(k^2) + 1e-6)
 *   S (Dk x Dv, fp32) = 0 at the document start; per token t:
 *   S = exp(g[t,h]) S ; u = beta[t,h] (v[t,h] - S^T kn) ; S += kn u^T ; o[t,h] = S^T qn
 * q, k (T,Hk,Dk) with token strides ldq, ldk; v (T,Hv,Dv) ldv; o (T,Hv,Dv) ldo; g, beta (T,Hv) dense.
 * scale is Dk^-1/2 in HF. cu_seqlens (n_docs+1) int32, nondecreasing from 0.
 * Documents never share state. Tokens outside [0, cu_seqlens[n_docs]) are not touched.
 * o must not alias an input. The order per token is HF's torch_recurrent_gated_delta_rule's
 * (decay, read, write, output), which its chunked form computes too. */
void cpu_gdn_delta_fwd(ct_backend *be, float *o, int ldo, const float *q, int ldq, const float *k, int ldk,
                       const float *v, int ldv, const float *g, const float *beta,
                       const int32_t *cu_seqlens, int n_docs, int Hk, int Hv, int Dk, int Dv, float scale);
/* Its backward (recomputing what it needs; nothing saved by the forward): dq, dk, dv overwritten
 * (dq, dk summed over the Hv/Hk value heads of each key head), dg, dbeta (T,Hv) overwritten,
 * given dout (T,Hv,Dv) with token stride lddo. As in the forward, rows of tokens outside
 * [0, cu_seqlens[n_docs]) are not touched. Memory: per (document, value head) in flight, one
 * Dk x Dv state per 64 tokens of the longest document plus 65 states for the block being
 * reversed, and (T, Hv, Dk) fp32 twice for the per-value-head dq, dk before the sum over heads.
 * The outputs must not alias the inputs. */
void cpu_gdn_delta_bwd(ct_backend *be, float *dq, int lddq, float *dk, int lddk, float *dv, int lddv,
                       float *dg, float *dbeta, const float *dout, int lddo,
                       const float *q, int ldq, const float *k, int ldk, const float *v, int ldv,
                       const float *g, const float *beta, const int32_t *cu_seqlens, int n_docs,
                       int Hk, int Hv, int Dk, int Dv, float scale);

/* The gated RMSNorm of a GDN layer's output, rows r = (t, h) of D elements:
 *   y = w * (x * rsqrt(mean(x^2) + eps)) * silu(z)     (w not offset: HF initialises it to 1)
 * x, z, y (T, nh, D) with token strides (head stride D); w (D). y may alias x or z. */
void cpu_gated_rmsnorm_fwd(ct_backend *be, float *y, int ldy, const float *x, int ldx, const float *z, int ldz,
                           const float *w, int T, int nh, int D, float eps);
/* Backward: dx, dz overwritten (w frozen). With n = x r, r = (mean(x^2) + eps)^-1/2 and
 * dn = dy w silu(z): dx = r dn - x r^3 / D * sum(dn x) ; dz = dy w n silu'(z).
 * dx and dz must not alias the inputs. */
void cpu_gated_rmsnorm_bwd(ct_backend *be, float *dx, int lddx, float *dz, int lddz, const float *dy, int lddy,
                           const float *x, int ldx, const float *z, int ldz, const float *w,
                           int T, int nh, int D, float eps);

/* The output gate of a gated full-attention layer: y[t,h,:] = x[t,h,:] * sigmoid(gate[t,h,:]),
 * x, y (T,nh,D) with token strides ldx, ldy (head stride D); gate with token stride ldg and head stride hsg
 * (Qwen3.5's q_proj interleaves per head [query (D) | gate (D)], so hsg = 2D there). y may alias x. */
void cpu_sigmoid_gate_fwd(ct_backend *be, float *y, int ldy, const float *x, int ldx, const float *gate, int ldg,
                          int hsg, int T, int nh, int D);
/* Backward: dx = dy sigmoid(gate) (may alias dy) and dgate = dy x sigmoid(gate) (1 - sigmoid(gate))
 * (same layout as gate, only its D gate elements per head written) overwritten. */
void cpu_sigmoid_gate_bwd(ct_backend *be, float *dx, int lddx, float *dgate, int lddg, const float *dy, int lddy,
                          const float *x, int ldx, const float *gate, int ldg, int hsg, int T, int nh, int D);

#endif
