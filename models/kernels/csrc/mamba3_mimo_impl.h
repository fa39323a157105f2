/* Body of mamba3_mimo.c for one scalar type REAL (suffix SFX). Layouts (all contiguous):
 * q, k (B, L, r, H, N), N even; v, o (B, L, r, H, P); adt, c, m (B, L, H); cos and sin
 * of theta and dtheta (B, L, H, R), theta the angles of the pairs (2l, 2l+1), l < R;
 * U0, UL (B, H, N, P);
 * ck (B, H, nck, N, P), nck = ceil(L / T): the state before steps 0, T, 2T, ...
 * sizes: B, L, r, H, N, P, T, threads, R. Returns 0, or -1 when a work buffer cannot be had.
 * The per-(batch, head) bodies (mamba3_mimo_body.h) are always inlined into callers with
 * N, P and r fixed at compile time for rank 4 and the common head sizes (16, 32, 64); other
 * shapes take the copy with sizes given at run time, the scalar copy when the head sizes
 * are not multiples of the vector width. */

#define M3_INLINE static inline __attribute__((always_inline))

/* xr_i = rot(x_i, theta) for the r rows of one step (stride xs in x, N in xr), with the
 * step's cos and signed sin spread over the channels: C = (c_0, c_0, c_1, c_1, .., 1, ..),
 * S = (-s_0, s_0, -s_1, s_1, .., 0, ..), so y_n = x_n C_n + x_(n xor 1) S_n, a loop over
 * pairs that vectorises (N is even; channels past 2R have C = 1, S = 0). */
M3_INLINE void SFX(m3_rot)(REAL *restrict xr, const REAL *restrict x, long xs, long r,
                           long N, const REAL *restrict C, const REAL *restrict S) {
    for (long i = 0; i < r; i++) {
        const REAL *restrict xi = x + i * xs;
        REAL *restrict yi = xr + i * N;
#pragma omp simd
        for (long n = 0; n < N; n += 2) {
            yi[n] = xi[n] * C[n] + xi[n + 1] * S[n];
            yi[n + 1] = xi[n + 1] * C[n + 1] + xi[n] * S[n + 1];
        }
    }
}

/* C and S of the step (m3_rot) from its R cosines and sines */
M3_INLINE void SFX(m3_spread)(REAL *restrict C, REAL *restrict S, const REAL *restrict cosv,
                              const REAL *restrict sinv, long R, long N) {
    for (long l = 0; l < R; l++) {
        C[2 * l] = C[2 * l + 1] = cosv[l];
        S[2 * l] = -sinv[l];
        S[2 * l + 1] = sinv[l];
    }
    for (long n = 2 * R; n < N; n++) {
        C[n] = 1;
        S[n] = 0;
    }
}

/* dx_i = rot(dy_i, -theta) into x's layout (stride xs); z_n += dy_n y_(n xor 1), from which
 * theta's gradient is z_(2l+1) - z_2l */
M3_INLINE void SFX(m3_unrot)(REAL *restrict dx, long xs, const REAL *restrict dy,
                             const REAL *restrict y, long r, long N, const REAL *restrict C,
                             const REAL *restrict S, REAL *restrict z) {
    for (long i = 0; i < r; i++) {
        const REAL *restrict dyi = dy + i * N, *restrict yi = y + i * N;
        REAL *restrict dxi = dx + i * xs;
#pragma omp simd
        for (long n = 0; n < N; n += 2) {
            dxi[n] = dyi[n] * C[n] - dyi[n + 1] * S[n];
            dxi[n + 1] = dyi[n + 1] * C[n + 1] - dyi[n] * S[n + 1];
            z[n] += dyi[n] * yi[n + 1];
            z[n + 1] += dyi[n + 1] * yi[n];
        }
    }
}

M3_INLINE REAL SFX(m3_dot)(const REAL *restrict x, const REAL *restrict y, long n) {
    REAL s = 0;
#pragma omp simd reduction(+ : s)
    for (long i = 0; i < n; i++) s += x[i] * y[i];
    return s;
}


/* vector copy (head sizes multiples of W) and scalar copy (any head size) of the step work */
typedef REAL SFX(m3_vec) __attribute__((vector_size(64), aligned(sizeof(REAL))));
#define VEC SFX(m3_vec)
#define W ((long)(64 / sizeof(REAL)))
#define LD(ptr) (*(const VEC *)(ptr))
#define ST(ptr, x) (*(VEC *)(ptr) = (x))
#define VZERO ((VEC){0})
#define HSUM(x) SFX(m3_hsum)(x)
#define VSFX(name) SFX(name##_v)
M3_INLINE REAL SFX(m3_hsum)(VEC x) {
    REAL s = 0;
    for (long i = 0; i < W; i++) s += x[i];
    return s;
}
#include "mamba3_mimo_body.h"
#undef VEC
#undef W
#undef LD
#undef ST
#undef VZERO
#undef HSUM
#undef VSFX
#define VEC REAL
#define W 1L
#define LD(ptr) (*(ptr))
#define ST(ptr, x) (*(ptr) = (x))
#define VZERO ((REAL)0)
#define HSUM(x) (x)
#define VSFX(name) SFX(name##_s)
#include "mamba3_mimo_body.h"
#undef VEC
#undef W
#undef LD
#undef ST
#undef VZERO
#undef HSUM
#undef VSFX

/* ITEM's copy for item bh with its work buffer (in an entry point, where ptr, sz, N, P, r
 * are at hand): rank 4 (mamba-ssm's default) with the common head sizes gets all loops
 * unrolled, head sizes that are multiples of the vector width the vector copy, the rest
 * the scalar copy. A macro: each branch inlines its body with the sizes as constants,
 * which a function given the body by pointer would not guarantee. */
#define M3_BY_SHAPE(ITEM, bh, work)                                                       \
    do {                                                                                  \
        const long VW = (long)(64 / sizeof(REAL));                                        \
        if (N == 16 && P == 16 && r == 4) SFX(ITEM##_v)(ptr, sz, bh, work, 16, 16, 4);    \
        else if (N == 32 && P == 32 && r == 4) SFX(ITEM##_v)(ptr, sz, bh, work, 32, 32, 4); \
        else if (N == 64 && P == 64 && r == 4) SFX(ITEM##_v)(ptr, sz, bh, work, 64, 64, 4); \
        else if (N % VW == 0 && P % VW == 0) SFX(ITEM##_v)(ptr, sz, bh, work, N, P, r);   \
        else SFX(ITEM##_s)(ptr, sz, bh, work, N, P, r);                                   \
    } while (0)

/* ptr: q, k, v, adt, c, m, U0, o, UL, ck, cos theta, sin theta */
int SFX(m3_fwd)(void **ptr, const long *sz) {
    const long B = sz[0], r = sz[2], H = sz[3], N = sz[4], P = sz[5], R = sz[8];
    const int threads = (int)sz[7];
    int failed = 0;
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (long bh = 0; bh < B * H; bh++) {
        REAL *work = malloc(sizeof(REAL) * (N * P + 2 * r * N + 2 * N));
        if (!work) {
#pragma omp atomic write
            failed = 1;
            continue;
        }
        M3_BY_SHAPE(m3_fwd_item, bh, work);
        free(work);
    }
    return failed ? -1 : 0;
}

/* ptr: q, k, v, adt, c, m, ck, do, dUL, then dq, dk, dv, dadt, dc, dm, dU0, then cos
 * theta, dtheta, sin theta (layouts as their forward twins); sizes as the forward. */
int SFX(m3_bwd)(void **ptr, const long *sz) {
    const long B = sz[0], r = sz[2], H = sz[3], N = sz[4], P = sz[5], T = sz[6], R = sz[8];
    const int threads = (int)sz[7];
    int failed = 0;
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (long bh = 0; bh < B * H; bh++) {
        REAL *buf = malloc(sizeof(REAL) * ((T + 3) * N * P + r * (5 * N + P) + 3 * N));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
            continue;
        }
        M3_BY_SHAPE(m3_bwd_item, bh, buf);
        free(buf);
    }
    return failed ? -1 : 0;
}

#undef M3_BY_SHAPE
