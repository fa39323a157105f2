/*
 * Mamba-3 MIMO recurrence on a CPU, forward and hand-written backward, loaded by
 * models/kernels/mamba3_mimo_cpu.py (which documents the maths and the layout); the body is
 * mamba3_mimo_impl.h, included once per scalar type.
 *
 * Per (batch, head), steps t = 1..L, ranks i, j = 1..r, with the trapezoid folded into the
 * keys (the running state U_t = S_t + mu_{t+1} sum_j k_j v_j^T, see mamba3_scan.py):
 *
 *   U_t = exp(adt_t) U_{t-1} + c_t sum_j k_{t,j} v_{t,j}^T,
 *   o_{t,i} = U_t^T q_{t,i} - m_t sum_j (q_{t,i} . k_{t,j}) v_{t,j}.
 *
 * Why C: the chunked PyTorch/SSD form runs the SSD over L r positions and then an r x r
 * correction as separate passes over memory; here a step is r rank-one updates of an
 * (N, P) state that stays in cache, its r readouts and the r x r scores, in one pass.
 *
 * Backward: the forward stores U at the start of every chunk of T steps; the backward
 * walks the chunks last to first, recomputes the chunk's T states from its checkpoint and
 * then runs the adjoint recurrence G_{t-1} = exp(adt_t) G_t (+ the readouts' q do^T).
 * One work item per (batch, head): it owns its rows of every output and gradient, so
 * results do not depend on the thread count or timing. Threads: OpenMP when compiled with
 * it (PyTorch's pool, as cpu_kernels.c), else serial.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#define M3_ABI 1

int m3_abi_version(void) { return M3_ABI; }

#define REAL float
#define SFX(name) name##_f32
#include "mamba3_mimo_impl.h"
#undef REAL
#undef SFX

#define REAL double
#define SFX(name) name##_f64
#include "mamba3_mimo_impl.h"
#undef REAL
#undef SFX
