/*
 * One decode step of the Mamba and Mamba-2 mixers, from the output of the layer's input
 * projection to the input of its output projection, in one call: loaded by
 * models/kernels/mamba_step_cpu.py (``mamba_step``, ``mamba2_step``, which document the
 * arguments; their plain PyTorch twins ``mamba_step_ref``, ``mamba2_step_ref`` there are
 * what the tests hold this file to).
 *
 * Mamba (Gu & Dao 2023), with xz the row of in_proj's output [x | z] (d_inner each):
 *
 *   conv      xc = silu(sum_k w_k window_k + bias), window = [conv cache | x] per channel;
 *             the new cache is the window's last W - 1 columns (a new tensor)
 *   x_proj    [dt_low | B | C] = W_x xc                     (dt_rank + 2 d_state rows)
 *   delta     softplus(W_dt dt_low + b_dt)                  per channel
 *   state     h' = exp(delta A) h + delta B xc   (allow_neg_eigval: 2 exp(delta A) - 1);
 *             A = -exp(A_log) (d_inner, d_state), passed in (the caller keeps it)
 *   output    y = (C . h' + D xc) silu(z)
 *
 * Mamba-2 (Dao & Gu 2024), with u the row of in_proj's output [z | x B C | dt_raw]:
 *
 *   conv      xBC = silu(conv(window)) over the conv_dim channels, as above
 *   per head  dt = softplus(dt_raw + dt_bias), a = exp(-dt exp(A_log)), group g of the head;
 *             S'[n, p] = a S[n, p] + B_g[n] dt x[p];  y[p] = C_g . S'[:, p] + D x[p]
 *   norm      per group of channels: o = rmsnorm(y silu(z)) w   (norm_before_gate=False)
 *
 * Work is split in phases (the conv per batch row, x_proj per output row for Mamba, the
 * state per (batch row, channel) or (batch row, head), Mamba-2's norm per (batch row,
 * group)); each item writes only its own outputs, so the result does not depend on the
 * thread count. The state passed in is read, never written: S' is a new tensor.
 *
 * Why C: at decode widths the step's elementwise work is a few thousand operations per
 * layer, and the chain of ~20 small PyTorch ops it replaces cost more in dispatch than
 * in arithmetic (docs: the issue 43 measurements).
 */
#include <math.h>
#include <stdlib.h>

#include "kernel_common.h"   /* libmvec declarations, exp_core_f32 */

#define MS_ABI 2

int ms_abi_version(void) { return MS_ABI; }

/* Mamba sizes: 0 B, 1 D (d_inner), 2 N (d_state), 3 R (dt_rank), 4 W (conv kernel), 5 ldxz
 * (row stride of xz), 6 off_z (column of z in xz; x is at column 0), 7 neg_eigval (0/1),
 * 8 threads.
 * Mamba ptrs: 0 xz (B, ldxz), 1 conv cache (B, D, W - 1), 2 its successor (new), 3 conv
 * weight (D, W), 4 conv bias (D) or NULL, 5 x_proj weight (R + 2N, D), 6 dt_proj weight
 * (D, R), 7 dt_proj bias (D), 8 A (D, N), 9 D skip (D), 10 h (B, D, N), 11 h' (new),
 * 12 y (B, D).
 *
 * Mamba-2 sizes: 0 B, 1 H (heads), 2 P (headdim), 3 N (d_state), 4 G (groups), 5 W,
 * 6 ldu (row stride of u), 7 off_xbc, 8 off_dt (z is at column 0), 9 threads.
 * Mamba-2 ptrs: 0 u (B, ldu), 1 conv cache (B, Cd, W - 1) with Cd = H P + 2 G N, 2 its
 * successor (new), 3 conv weight (Cd, W), 4 conv bias (Cd) or NULL, 5 dt_bias (H),
 * 6 A_log (H), 7 D (H), 8 norm weight (H P), 9 S (B, H, N, P), 10 S' (new), 11 out
 * (B, H P), 12 double scal[1] = {norm eps}.
 *
 * ms_add_rmsnorm (ABI 2): the residual add and RMS norm between two layers' steps (its
 * comment in mamba_step_impl.h), for models.ssm.mamba.RecurrentStack's decode step.
 *
 * Return: 0, or -1 when a work buffer could not be allocated. */

/* float32's exp: the inlined exp_core_f32 (so that the loops over channels and over
 * d_state vectorise), its argument clamped to [-87, 88] (e^-87 is near float32's smallest
 * normal: below it a transition or a softplus is 0 to float32's resolution; above 88 the
 * callers' results no longer depend on it: softplus passes x > 20 through, silu's
 * x / (1 + e^-x) is then 0 to float32's resolution) */
static inline float ms_exp_f32(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    return exp_core_f32(x);
}

#define REAL float
#define EXPV(x) ms_exp_f32(x)
#define LOG1P(x) log1pf(x)
#define SFX(name) name##_f32
#include "mamba_step_impl.h"
#undef REAL
#undef LOG1P
#undef EXPV
#undef SFX

#define REAL double
#define EXPV(x) exp(x)
#define LOG1P(x) log1p(x)
#define SFX(name) name##_f64
#include "mamba_step_impl.h"
#undef REAL
#undef LOG1P
#undef EXPV
#undef SFX
