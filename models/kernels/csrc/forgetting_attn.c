/*
 * Forgetting attention (FoX; Lin et al., ICLR 2025) on a CPU, forward and hand-written
 * backward, loaded by models/kernels/forgetting_attn_cpu.py (which documents the maths and
 * the layout; the body is forgetting_attn_impl.h, included once per scalar type).
 *
 *   o_i = sum_{j <= i} P_ij v_j,  P_ij = exp(z_ij - lse_i),
 *   z_ij = q_i . k_j * scale + c_i - c_j,   c_t = sum_{l <= t} log f_l.
 *
 * Why C: PyTorch's fused CPU attention takes no per-pair bias with a gradient, and folding
 * the bias into an extra head dimension (q' = [q, 1/scale], k' = [k, -c]) moves d = 16 off
 * its fast path (its backward is 1.5x slower at d = 17). Here the bias costs two adds per
 * pair and the gradient of c is the row and column sums of dS, taken while dS is in cache.
 *
 * Work items: the forward runs one (batch*head, block of BQ queries) per item; the backward
 * one batch*head per item (it owns that head's dk, dv and dc, so nothing is shared between
 * threads and results do not depend on thread timing). Threads: OpenMP when compiled with
 * it (PyTorch's pool, see cpu_kernels.c), else serial.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_common.h"   /* libmvec declarations, exp_core_f32 */

#define FA_ABI 1
#define BQ 16      /* query rows per block: their accumulators stay in registers */
#define JT 16      /* keys per score tile: one AVX-512 register of floats */
#define DMAX 256   /* largest head dimension (the Python side falls back above it) */

int fa_abi_version(void) { return FA_ABI; }

/* exp(x) for x <= 0 in float32, inlined so the score loops vectorise (exp_core_f32 in
 * kernel_common.h). Below -87 (e^-87 = 1.6e-38) the result is 0, which also covers -inf (a
 * masked pair). */
static inline float exp_neg_f32(float x) {
    const int under = x < -87.0f;
    const float e = exp_core_f32(under ? -87.0f : x);
    return under ? 0.0f : e;
}

static inline double exp_neg_f64(double x) { return exp(x); }

#ifdef _OPENMP
#include <omp.h>
#endif

/* 64-byte vectors (one AVX-512 register; GCC/Clang vector extensions, so any ISA builds),
 * aligned to their element only: loads and stores may be unaligned */
typedef float vec_f32 __attribute__((vector_size(64), aligned(4)));
typedef double vec_f64 __attribute__((vector_size(64), aligned(8)));

#define REAL float
#define EXPNEG exp_neg_f32
#define SFX(name) name##_f32
#include "forgetting_attn_impl.h"
#undef REAL
#undef EXPNEG
#undef SFX

#define REAL double
#define EXPNEG exp_neg_f64
#define SFX(name) name##_f64
#include "forgetting_attn_impl.h"
#undef REAL
#undef EXPNEG
#undef SFX
