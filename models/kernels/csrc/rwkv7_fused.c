/*
 * RWKV-7's elementwise chains around its matmuls, forward and backward, loaded by
 * models/kernels/rwkv7_cpu.py (which documents the maths; its torch twins of these five
 * functions are the oracle in tests/models/test_rwkv7_cpu.py). The body is
 * rwkv7_fused_impl.h, included once per scalar type.
 *
 *   mix_fwd   x_c = x + (x_{t-1} - x) mu_c                      (the token-shift mixes)
 *   mix_bwd   g_x += sum_c g_c (1 - mu_c),  g_{x_{t-1}} += sum_c g_c mu_c,
 *             g_mu_c += sum_t g_c (x_{t-1} - x)
 *   prep_fwd  k, z_w, z_a -> k o (1 + (sigmoid(z_a) - 1) k_a), -kk, kk sigmoid(z_a),
 *             -e^{-1/2} sigmoid(z_w),   kk = normalize_head(k o k_k)
 *   prep_bwd  their gradients to k, z_a, z_w, k_a, k_k
 *   out_fwd   z = (groupnorm_head(o) + (r.k.r_k)_head v) o gate, and the norm's statistics
 *   out_bwd   z again and the gradients to o, r, k, v, gate, r_k, the norm's weight and bias
 *
 * Why C: in PyTorch each of these is 6-25 whole passes over (rows, d_model) tensors (one
 * per op, forward and backward); here one pass per chain with a row in cache. Every tensor
 * is row-major (n, D), D = H * K, contiguous (the Python side guarantees it); the calls
 * are one work item (up to rwkv7_cpu.SLICE rows of one batch row), serial.
 *
 * Entry points: int <name>_f32 / _f64 (void **p, long *s), pointers and sizes as listed
 * above each function in the header; 0 on success.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_common.h"   /* libmvec declarations */

#define RK_ABI 1

int rk_abi_version(void) { return RK_ABI; }

#define REAL float
#define EXP expf
#define SQRT sqrtf
#define SFX(name) name##_f32
#include "rwkv7_fused_impl.h"
#undef REAL
#undef EXP
#undef SQRT
#undef SFX

#define REAL double
#define EXP exp
#define SQRT sqrt
#define SFX(name) name##_f64
#include "rwkv7_fused_impl.h"
#undef REAL
#undef EXP
#undef SQRT
#undef SFX
