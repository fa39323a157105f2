/*
 * One decode step of the linear-RNN mixers without a delta rule (GLA, RetNet's retention,
 * linear attention), from the layer's projected input to the input of its output
 * projection, in one call: loaded by models/kernels/linear_rnn_cpu.py (``gla_step``,
 * ``retention_step``, ``linear_attention_step``, which document the arguments; each has a
 * plain PyTorch twin ``*_step_ref`` there that the tests hold this file to).
 *
 * Per batch row b and head h, with y the row of x_t's stacked projections:
 *
 *   q, k, v   slices of y (GLA: the decay's low-rank hidden and the output gate too)
 *   GLA       a_i = exp(logsigmoid(b2_i + W2_i . hidden) / normalizer)   per key channel
 *   retention q, k rotated by RoPE at the row's position; a_i = gamma_h (fixed per head)
 *   linear    q, k <- phi(q), phi(k) (elu + 1 or identity); v <- [v, 1] with the normaliser
 *   state     S'[i, j] = a_i S[i, j] + k_i v_j              (S: head_k x state_v)
 *   readout   o_j = scale sum_i q_i S'[i, j]
 *   output    GLA: rmsnorm(o) w * silu(gate); retention: groupnorm_head(o) w + b, * silu(gate);
 *             linear: o / (o_norm + eps) with the normaliser, then rmsnorm(o) w if asked
 *
 * The update and the readout share one pass over S (each row of S is read once, written
 * once). Work items are (batch row, head) pairs, each writing its own rows of S' and of
 * the output, so the result does not depend on the thread count. S' may be S itself.
 *
 * Why C: at decode widths (d_model 256, batch 1) the step's arithmetic is a few thousand
 * multiply-adds per head, and the chain of 50-100 small PyTorch ops per layer it replaces
 * cost more in dispatch than in arithmetic (docs: the issue 43 measurements).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#define LRS_ABI 1
#define LRS_MAXD 1024     /* largest head_k / state_v dim (the Python side falls back above) */

enum { LRS_GLA = 0, LRS_RETENTION = 1, LRS_LINEAR = 2 };
enum { NORM_NONE = 0, NORM_RMS = 1, NORM_GROUP = 2 };

int lrs_abi_version(void) { return LRS_ABI; }

/* sizes: 0 B, 1 H, 2 K (head_k), 3 V (head_v, output), 4 Vs (state value dim: V, or V + 1
 * with linear attention's normaliser), 5 mode, 6 ldy (row stride of y), 7 off_q, 8 off_k,
 * 9 off_v, 10 off_gate (GLA, retention), 11 off_low (GLA's low-rank hidden), 12 R (its
 * width), 13 phi (linear: 1 elu + 1, 0 identity), 14 normalize (linear), 15 norm (NORM_*),
 * 16 threads.
 * ptrs: 0 y (B, ldy), 1 S (B, H, K, Vs), 2 S' (same; may be S), 3 out (B, H V),
 * 4 double scal[4] = {scale, norm eps, GLA's gate_logit_normalizer, linear's eps},
 * 5 W2 (H K, R) and 6 b2 (H K) (GLA), 7 norm weight (V for rms, H V for group),
 * 8 norm bias (H V, group), 9 pos (B) int64 and 10 inv_freq (K / 2) double (retention),
 * 11 decay (H) (retention; in the compute dtype). */

#define REAL float
#define SFX(name) name##_f32
#include "linear_rnn_step_impl.h"
#undef REAL
#undef SFX

#define REAL double
#define SFX(name) name##_f64
#include "linear_rnn_step_impl.h"
#undef REAL
#undef SFX
