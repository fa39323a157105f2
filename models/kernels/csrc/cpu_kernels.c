/*
 * CPU kernels, loaded by models/kernels/cpu_kernels.py: the linear-RNN recurrences of
 * models/kernels/linear_rnn.py (linear_rnn_impl.h, documented there), RWKV-7's and KDA's
 * generalised delta rule (dplr_impl.h, documented there), the causal
 * depthwise conv (causal_conv1d_impl.h) and the fused selective scan
 * (S6, Gu & Dao 2023; selective_scan_impl.h), forward and hand-written backward of
 *
 *   delta_t = softplus(delta_raw_t + delta_bias)       (or without softplus)
 *   h_t     = exp(delta_t * A) * h_{t-1} + delta_t * u_t * B_t
 *   out_t   = (C_t . h_t + D * u_t) * silu(z_t)        (z optional, D optional)
 *
 * for every batch row b and channel d (A: per channel and state index n; B_t, C_t: per b, t).
 * models/kernels/cpu_kernels.py builds this file with the system C compiler and calls it
 * through ctypes (backend "cpu" of models/kernels/selective_scan.py).
 *
 * Why it exists: in PyTorch the recurrence is a chain of tiny ops per time step and launch
 * overhead, not arithmetic, sets the speed; around it, softplus, the D skip and the gate
 * are separate passes over (batch, L, dim) tensors, forward and backward. Here a work item
 * is one batch row and a tile of W channels: its state h (N, W) stays in cache, every
 * loop over the W lanes is vectorised (exp() too: inlined for float32, glibc's libmvec
 * for float64 and log1p when SCAN_VECTOR_EXP is defined), no reduction crosses lanes, and
 * items run in parallel.
 *
 * Layout: any strides on (batch, time, channel) for u, delta, z, out and the gradients, so
 * the kernel reads the Mamba block's time-major tensors (b, L, d) in place, and mamba-ssm's
 * (b, d, L) ones too (a step then gathers its W channels at stride L: the same cache lines
 * serve the next steps). Time-major with contiguous channels is the fast path.
 *   u, delta, z : element (b, t, d) at b * s_b + t * s_t + d * s_d
 *   out, du, ddelta, dz : the out strides; dout: its own strides
 *   B, C        : element (b, t, n) at b * s_b + t * s_t + n      (views of x_proj's output)
 *   At          : (N, dim) contiguous (A transposed), D, delta_bias: (dim,)
 *   h0, h_last, dh_last, dh0, dA_part : (batch, dim, N) contiguous
 *   dD_part, dbias_part : (batch, dim)    (caller sums over batch)
 *   ckpt        : (batch, n_chunks, N, dim), the state h_{t-1} at every chunk start t = cK
 *   dB_part, dC_part : (batch * G, L, N): each work item's sum over its channels
 * Backward recomputes each chunk of K steps from its checkpoint (memory O(L / K), not O(L)),
 * then runs the adjoint recurrence g_t = dL/dh_t = C_t dy_t + exp(delta_{t+1} A) g_{t+1}
 * backwards through it. Every number is written by exactly one work item, so results do
 * not depend on thread timing.
 *
 * Entry points take arrays, so the Python side stays one list per call:
 *   p (pointers): 0 u, 1 delta, 2 z|NULL, 3 At, 4 B, 5 C, 6 D|NULL, 7 delta_bias|NULL,
 *                 8 h0|NULL, 9 out, 10 h_last, 11 ckpt|NULL (forward: NULL = no backward);
 *                 backward adds 12 dout, 13 dh_last|NULL, 14 du, 15 ddelta, 16 dz|NULL,
 *                 17 dA_part, 18 dD_part, 19 dbias_part, 20 dB_part, 21 dC_part, 22 dh0
 *   s (sizes):    0 batch, 1 L, 2 dim, 3 N, 4 K, 5 softplus, 6-8 u strides (b, t, d),
 *                 9-11 delta strides, 12-14 z strides, 15-16 B strides (b, t), 17-18 C
 *                 strides, 19-21 out strides, 22 threads; backward adds 23 G (channel
 *                 groups per batch row), 24-26 dout strides
 * Functions return 0 on success, -1 when a work buffer cannot be allocated.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_common.h"   /* libmvec declarations, exp_core_f32 */

/* lanes per tile: one AVX-512 register of floats; plain loops, so any ISA works */
#define W 16

/* ---- parallel loop over work items ----
 * With OpenMP the items run on the OpenMP runtime that PyTorch already loaded (same
 * soname, libgomp.so.1, so the dynamic loader reuses it): one thread pool for both, where a
 * private pool would fight PyTorch's spin-waiting OpenMP threads for the cores (measured:
 * 2 threads gave no speed-up that way). Without OpenMP, a minimal pthread pool. */

typedef void (*item_fn)(const void *args, long item);

#ifdef _OPENMP
#include <omp.h>

static void run_parallel(item_fn fn, const void *args, long n_items, int n_threads) {
    if (n_threads < 1) n_threads = 1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads)
    for (long i = 0; i < n_items; i++) fn(args, i);
}
#else
typedef struct {
    item_fn fn;
    const void *args;
    long n_items;
    atomic_long next;
} pool_t;

static void *pool_worker(void *p) {
    pool_t *pool = (pool_t *)p;
    long i;
    while ((i = atomic_fetch_add(&pool->next, 1)) < pool->n_items) pool->fn(pool->args, i);
    return NULL;
}

static void run_parallel(item_fn fn, const void *args, long n_items, int n_threads) {
    pool_t pool;
    pool.fn = fn;
    pool.args = args;
    pool.n_items = n_items;
    atomic_init(&pool.next, 0);
    if (n_threads > n_items) n_threads = (int)n_items;
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 256) n_threads = 256;
    pthread_t th[256];
    int started = 0;
    for (int k = 1; k < n_threads; k++) {
        if (pthread_create(&th[started], NULL, pool_worker, &pool) == 0) started++;
    }
    pool_worker(&pool); /* this thread works too; if no thread could start, it does all */
    for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
}
#endif

/* run_parallel, then an entry point's status: 0, or -1 when an item could not allocate its
 * work buffer (it then set *failed) */
static int run_items(item_fn fn, const void *args, atomic_int *failed, long n_items,
                     long n_threads) {
    run_parallel(fn, args, n_items, (int)n_threads);
    return atomic_load(failed) ? -1 : 0;
}

/* ---- exp for float32, inlined ----
 * The scan needs N exponentials per channel and step: exp_core_f32 (kernel_common.h), with
 * inputs clamped to [-87, 88] so 2^n stays a normal number: e^-87 = 1.6e-38 stands in for
 * anything smaller (a decay that small is zero for every practical purpose), e^88 for
 * anything larger. A NaN stays NaN (the comparisons below are false for it), so a
 * diverging run is still caught. */
static inline float exp_f32(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    return exp_core_f32(x);
}

/* ---- the kernels, once per scalar type ---- */


#define SCALAR float
#define EXP exp_f32
#define LOG1P log1pf
#define SFX(name) name##_f32
#include "selective_scan_impl.h"
#include "causal_conv1d_impl.h"
#include "linear_rnn_impl.h"
#include "dplr_impl.h"        /* after linear_rnn_impl.h: uses its helpers */
#undef SCALAR
#undef EXP
#undef LOG1P
#undef SFX

#define SCALAR double
#define EXP exp
#define LOG1P log1p
#define SFX(name) name##_f64
#include "selective_scan_impl.h"
#include "causal_conv1d_impl.h"
#include "linear_rnn_impl.h"
#include "dplr_impl.h"        /* after linear_rnn_impl.h: uses its helpers */
#undef SCALAR
#undef EXP
#undef LOG1P
#undef SFX

/* ABI version: the Python loader refuses a library whose version differs. */
int ss_abi_version(void) { return 5; }
