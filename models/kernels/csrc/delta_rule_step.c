/*
 * One decode step of the delta-rule mixers (DeltaNet, Gated DeltaNet, Gated DeltaProduct),
 * from the layer's projected input to the input of its output projection, in one call:
 * loaded by models/kernels/linear_rnn_cpu.py (``delta_rule_step``, which documents the
 * arguments; its plain PyTorch twin ``delta_rule_step_ref`` there is what the tests hold
 * this file to).
 *
 * With y the row of x_t's stacked projections [q | k | v | b | (a) | (gate)]:
 *
 *   conv      c = [q | k | v] channels (key_dim (1 + n) + value_dim n): the causal
 *             depthwise conv's window [cache | y_c] times its filter (+ bias), then SiLU;
 *             the new cache is the window's last W - 1 columns (a new tensor). Without the
 *             short conv: SiLU(y_c).
 *   q, k      L2-normalised per head (x / max(|x|, 1e-12), F.normalize)
 *   beta_j    sigmoid(b_j) (2 sigmoid with allow_neg_eigval), per value head, j < n
 *   decay     exp(-exp(A_log) softplus(a + dt_bias)) per value head (Gated; else 1);
 *             KDA: per key channel, from f (passed apart), scaling S's rows
 *   state     S <- decay S; for j < n: S <- S + beta_j k_j (v_j - S^T k_j)^T
 *   readout   o = scale S^T q
 *   output    rmsnorm(o) w, times silu(gate) for the gated layers (KDA: sigmoid(gate),
 *             the gate passed apart)
 *
 * Grouped value heads: value head hv reads q/k head hv / (Hv / H). The state's rows are
 * passed n + 1 times (decay + first S^T k, then each write fused with the next S^T k or,
 * after the last, the readout). Phase 1 (per batch row) runs the conv and the norms into
 * the scratch act (B, C); phase 2 (per batch row and value head) the rest, each work item
 * writing its own rows of S' and of out, so the result does not depend on the thread
 * count. S' must not be S.
 *
 * Why C: at decode widths (d_model 256, batch 1) the step is a few thousand multiply-adds
 * per head; the ~75 small PyTorch ops per layer it replaces (``_DeltaBase._fast_step``)
 * cost more in dispatch than in arithmetic.
 */
#include <math.h>
#include <stdlib.h>

#include "kernel_common.h"   /* libmvec declarations, exp_core_f32 */

#define DRS_ABI 2
#define DRS_MAXD 1024     /* largest head_k / head_v dim (the Python side falls back above) */

int drs_abi_version(void) { return DRS_ABI; }

/* sigmoid(z) = 1 / (1 + e^-z); float32 with the inlined exp (so the loops over channels
 * vectorise), its argument clamped to [-87, 88] (sigmoid is then exact to float32's
 * resolution); float64 with libm's (libmvec's in a vectorised loop) */
static inline float drs_sigmoid_core_f32(float z) {
    float e = -z;
    e = e < -87.0f ? -87.0f : e;
    e = e > 88.0f ? 88.0f : e;
    return 1.0f / (1.0f + exp_core_f32(e));
}

static inline double drs_sigmoid_core_f64(double z) { return 1.0 / (1.0 + exp(-z)); }

/* sizes: 0 B, 1 H (q/k heads), 2 Hv (value heads), 3 dk, 4 dv, 5 n (Householder rows),
 * 6 W (conv kernel size; 0: no short conv), 7 ldy (row stride of y), 8 off_qkv, 9 off_b,
 * 10 off_a (-1: no forget gate), 11 off_g (-1: no output gate), 12 neg_eigval (0/1),
 * 13 threads.
 * ptrs: 0 y (B, ldy), 1 S (B, Hv, dk, dv), 2 S' (same shape, new), 3 out (B, Hv dv),
 * 4 act (B, C) scratch, 5 conv cache (B, C, W - 1), 6 its successor (same, new),
 * 7 conv weight (C, W), 8 conv bias (C) or NULL, 9 A_log (Hv), 10 dt_bias (Hv),
 * 11 norm weight (dv), 12 double scal[2] = {scale, norm eps},
 * 13 KDA's decay input f (B, Hv dk) or NULL: then the decay is per key channel,
 *    exp(-exp(A_log_hv) softplus(f + dt_bias)) with dt_bias (Hv dk), scaling S's rows,
 *    and off_a is not read,
 * 14 KDA's output gate (B, Hv dv) or NULL: then o is times sigmoid(gate) (off_g not read).
 * ABI 2: pointers 13 and 14. */

#define REAL float
#define SIGMOID drs_sigmoid_core_f32
#define SFX(name) name##_f32
#include "delta_rule_step_impl.h"
#undef REAL
#undef SIGMOID
#undef SFX

#define REAL double
#define SIGMOID drs_sigmoid_core_f64
#define SFX(name) name##_f64
#include "delta_rule_step_impl.h"
#undef REAL
#undef SIGMOID
#undef SFX
