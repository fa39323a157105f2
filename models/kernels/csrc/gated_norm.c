/*
 * Gated RMS norm on a CPU, forward and hand-written backward in one pass each over the data,
 * loaded by models/kernels/gated_norm_cpu.py (which documents the maths and the layout; the
 * body is gated_norm_impl.h, included once per scalar type).
 *
 * Per row and group of gs channels, a(z) = silu(z) or sigmoid(z):
 *   gate before norm (Mamba-2):   h = x a(z),  y = h r w,  r = rsqrt(mean_group(h^2) + eps)
 *   norm before gate (per head):  y = x r w a(z),          r = rsqrt(mean_group(x^2) + eps)
 *
 * Why C: in PyTorch the norm and its gate are about eight whole-tensor elementwise passes
 * forward and a dozen backward (sigmoid, products, pow, mean, rsqrt and their autograd
 * twins), and the recomputed form runs the forward twice. Here a group's channels stay in
 * cache between the reduction and the scaling, the sigmoid is computed once per pass, and
 * every loop over channels is vectorised (float32 exp inlined: kernel_common.h).
 *
 * Work items: fixed blocks of rows (their number depends on the shapes only); each item
 * writes its own rows of the outputs and its own row of the weight-gradient partial sums,
 * so results do not depend on the thread count or timing. Threads: OpenMP when compiled
 * with it (PyTorch's pool, as cpu_kernels.c), else serial.
 *
 * Entry points (int f(void **p, long *s), 0 on success):
 *   gn_fwd: p 0 &eps (double), 1 x, 2 z, 3 w, 4 out, 5 rstd (rows, G) | NULL
 *           s 0 rows, 1 G, 2 gs, 3 norm_before_gate, 4 act (0 silu, 1 sigmoid), 5 threads,
 *             6 items, 7 x row stride, 8 z row stride  (channels contiguous; out (rows, d))
 *   gn_bwd: p 0 &eps, 1 x, 2 z, 3 w, 4 rstd, 5 dy, 6 dx, 7 dz, 8 dw_part (items, d) | NULL
 *           s as gn_fwd, then 9 dy row stride  (dx, dz (rows, d) contiguous)
 *
 * And Mamba-3's D skip with its gate, out = (y + D x) a(z) (D per channel), one pass each way:
 *   sg_fwd: p 0 unused, 1 y, 2 x, 3 z, 4 D (d,), 5 out (rows, d)
 *           s 0 rows, 1 d, 2 act, 3 threads, 4 items, 5-7 y, x, z row strides
 *   sg_bwd: p 0 unused, 1 y, 2 x, 3 z, 4 D, 5 dout, 6 dy, 7 dx, 8 dz (rows, d) contiguous,
 *           9 dD_part (items, d);  s as sg_fwd, then 8 dout row stride
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_common.h"   /* libmvec declarations, exp_core_f32 */

#ifdef _OPENMP
#include <omp.h>
#endif

#define GN_ABI 2

int gn_abi_version(void) { return GN_ABI; }

/* sigmoid(z) = 1 / (1 + e^-z); float32 with the inlined exp, its argument clamped to
 * [-87, 88] (sigmoid is then 1 - 1.6e-38 or 6e-39: exact to float32's resolution) */
static inline float gn_sigmoid_f32(float z) {
    float e = -z;
    e = e < -87.0f ? -87.0f : e;
    e = e > 88.0f ? 88.0f : e;
    return 1.0f / (1.0f + exp_core_f32(e));
}

static inline double gn_sigmoid_f64(double z) { return 1.0 / (1.0 + exp(-z)); }

#define REAL float
#define SIGMOID gn_sigmoid_f32
#define SFX(name) name##_f32
#include "gated_norm_impl.h"
#undef REAL
#undef SIGMOID
#undef SFX

#define REAL double
#define SIGMOID gn_sigmoid_f64
#define SFX(name) name##_f64
#include "gated_norm_impl.h"
#undef REAL
#undef SIGMOID
#undef SFX
