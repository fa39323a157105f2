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
 * sin are taken once for q and k (vectorised through libmvec where it links) and each row
 * is read and written once per direction.
 *
 * Work items: fixed blocks of rows, each writing only its own rows, so results do not
 * depend on the thread count. Threads: OpenMP when compiled with it (PyTorch's pool).
 *
 * Entry points (int f(void **p, long *s), 0 on success, -1 when a buffer cannot be had):
 *   rot_fwd: p 0 q, 1 k, 2 theta, 3 qr, 4 kr
 *            s 0 rows, 1 N, 2 R, 3 threads, 4 items, 5 q row stride, 6 k row stride,
 *              7 theta row stride  (channels contiguous; qr, kr (rows, N) contiguous)
 *   rot_bwd: p 0 theta, 1 qr, 2 kr, 3 dqr, 4 dkr, 5 dq, 6 dk, 7 dtheta (rows, R)
 *            s as rot_fwd, 5 dqr row stride, 6 dkr row stride  (the rest contiguous)
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef SCAN_VECTOR_EXP
/* glibc's vector variants (libmvec), so the loops over the angles vectorise */
float sinf(float) __attribute__((simd("notinbranch")));
float cosf(float) __attribute__((simd("notinbranch")));
double sin(double) __attribute__((simd("notinbranch")));
double cos(double) __attribute__((simd("notinbranch")));
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

#define ROT_ABI 1
#define ROT_BLOCK 64     /* rows whose cos and sin are taken in one vectorised loop */

int rot_abi_version(void) { return ROT_ABI; }

#define REAL float
#define SIN sinf
#define COS cosf
#define SFX(name) name##_f32
#include "rotate_impl.h"
#undef REAL
#undef SIN
#undef COS
#undef SFX

#define REAL double
#define SIN sin
#define COS cos
#define SFX(name) name##_f64
#include "rotate_impl.h"
#undef REAL
#undef SIN
#undef COS
#undef SFX
