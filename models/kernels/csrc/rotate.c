/*
 * Mamba-3's data-dependent rotation of q and k on a CPU, forward and hand-written backward,
 * loaded by models/kernels/rotate_cpu.py (which documents the maths and the layout; the
 * body is rotate_impl.h, included once per scalar type).
 *
 * Per row (one batch row, step and head) and angle i < R, with c = cos(theta_i),
 * s = sin(theta_i), pairs (a, b) = (x_2i, x_2i+1):
 *   y_2i = a c - b s,   y_2i+1 = a s + b c     (channels past 2R copied)
 * for q and k with the same angles. Backward: dx = the gradient turned back by -theta,
 * dtheta_i = sum over q and k of dy_2i+1 y_2i - dy_2i y_2i+1.
 *
 * Why C: in PyTorch the rotation is cos and sin of the angles, then four strided
 * multiply-adds per tensor, forward; backward as many again plus three for the angles'
 * gradient, each a pass over a (batch, L, heads, d_state) tensor. Here the angles' cos and
 * sin are taken once for q and k (float32: an inlined, vectorised sin/cos) and each row
 * is read and written once per direction.
 *
 * Work items: fixed blocks of rows, each writing only its own rows, so results do not
 * depend on the thread count. Threads: OpenMP when compiled with it (PyTorch's pool).
 *
 * Entry points (int f(void **p, long *s), 0 on success, -1 when a buffer cannot be had):
 *   rot_fwd: p 0 q, 1 k, 2 theta, 3 qr, 4 kr, 5 coef (rows) | NULL, 6 kc, 7 qk (rows)
 *            s 0 rows, 1 N, 2 R, 3 threads, 4 items, 5 q row stride, 6 k row stride,
 *              7 theta row stride  (channels contiguous; qr, kr, kc (rows, N) contiguous)
 *            with coef also kc = kr coef (the chunked form's keys) and qk = qr . kr;
 *            p 8 q bias, 9 k bias (hq, N) | NULL, s 8 hq, 9 q head stride, 10 k head
 *            stride: row r reads q + (r / hq) sq + (r % hq) sqh (+ q bias row r % hq)
 *            (q and k broadcast over heads read once per head, the bias added on the way)
 *   rot_bwd: p 0 theta, 1 qr, 2 kr, 3 dqr, 4 dkr, 5 dq, 6 dk, 7 dtheta (rows, R),
 *            8 coef | NULL, 9 dkc, 10 dqk (rows), 11 dcoef (rows)
 *            s as rot_fwd, 5 dqr row stride, 6 dkr row stride, 8 dkc row stride
 *   rot_angles_fwd / rot_angles_bwd: Mamba-3's angles theta_t = (theta0 + sum_{s<=t}
 *            omega_s dt_s) mod 2 pi and their backward (layout in rotate_impl.h)
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* sin and cos of a float32 angle, inlined so that the loop over a block's angles vectorises
 * (GCC turns sinf and cosf of one argument into a scalar sincosf call): x = n pi/2 + r with
 * n = round(x 2/pi), r by a three-part Cody-Waite reduction, |r| <= pi/4; sin r and cos r by
 * their minimax polynomials (Cephes' sinf/cosf coefficients, error ~1 ulp of float32); the
 * quadrant n mod 4 swaps and signs them. Accurate while |x| 2/pi stays well below 2^22: the
 * callers take |x| > ROT_BIG_ANGLE through libm instead (the angles Mamba-3 passes are
 * reduced mod 2 pi). */
static inline __attribute__((always_inline)) void rot_sincos_f32(float x, float *s, float *c) {
    const float shifter = 12582912.0f;               /* 1.5 * 2^23: round to nearest */
    const float n = (x * 0.636619772367581343f + shifter) - shifter;
    const float r = ((x - n * 1.5703125f) - n * 4.837512969970703125e-4f) - n * 7.54978995489188216e-8f;
    const float r2 = r * r;
    const float sp = r + r * r2 * (-1.6666654611e-1f + r2 * (8.3321608736e-3f + r2 * -1.9515295891e-4f));
    const float cp = 1.0f - 0.5f * r2
                     + r2 * r2 * (4.166664568298827e-2f + r2 * (-1.388731625493765e-3f + r2 * 2.443315711809948e-5f));
    const int q = (int)n;
    const float ss = (q & 1) ? cp : sp, cc = (q & 1) ? sp : cp;
    *s = (q & 2) ? -ss : ss;
    *c = ((q + 1) & 2) ? -cc : cc;
}

static inline void rot_sincos_libm_f32(float x, float *s, float *c) {
    *s = sinf(x);
    *c = cosf(x);
}

static inline void rot_sincos_f64(double x, double *s, double *c) {
    *s = sin(x);
    *c = cos(x);
}

#define ROT_BIG_ANGLE 8192.0

#ifdef _OPENMP
#include <omp.h>
#endif

#define ROT_ABI 4
#define ROT_BLOCK 64     /* rows whose cos and sin are taken in one vectorised loop */

int rot_abi_version(void) { return ROT_ABI; }

#define REAL float
#define SINCOS rot_sincos_f32
#define SINCOS_LIBM rot_sincos_libm_f32
#define SFX(name) name##_f32
#include "rotate_impl.h"
#undef REAL
#undef SINCOS
#undef SINCOS_LIBM
#undef SFX

#define REAL double
#define SINCOS rot_sincos_f64
#define SINCOS_LIBM rot_sincos_f64
#define SFX(name) name##_f64
#include "rotate_impl.h"
#undef REAL
#undef SINCOS
#undef SINCOS_LIBM
#undef SFX
