/* Body of mamba3_mimo.c for one scalar type REAL (suffix SFX). Layouts (all contiguous):
 * q, k (B, L, r, H, N), N even; v, o (B, L, r, H, P); adt, c, m (B, L, H); C and S
 * (B, L, H, N): the cos and signed sin of theta spread over the channels (m3_rot), theta
 * the angles of the pairs (2l, 2l+1), l < R; dtheta (B, L, H, R); U0, UL (B, H, N, P);
 * ck (B, H, nck, N, P), nck = ceil(L / T): the state before steps 0, T, 2T, ...
 * sizes: B, L, r, H, N, P, T, threads, R. Returns 0, or -1 when a work buffer cannot be had.
 * The per-(batch, head) bodies are always inlined into callers with N and P fixed at
 * compile time for the common head sizes (16, 32, 64), so the row loops are unrolled and
 * vectorised without remainder code; other sizes take the generic copy. */

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

/* One step of the state, U = a U + c sum_j kr_j v_j^T, then (when o is given) the r
 * readouts o_i = U^T qr_i, row by row while the row is in registers. */
M3_INLINE void SFX(m3_step)(REAL *restrict U, const REAL *restrict kr, const REAL *restrict v,
                            long vs, const REAL *restrict qr, REAL *restrict o, long r,
                            long N, long P, REAL a, REAL c) {
    if (o)
        for (long i = 0; i < r; i++)
            for (long p = 0; p < P; p++) o[i * vs + p] = 0;
    for (long n = 0; n < N; n++) {
        REAL *restrict row = U + n * P;
#pragma omp simd
        for (long p = 0; p < P; p++) row[p] *= a;
        for (long j = 0; j < r; j++) {
            const REAL kc = c * kr[j * N + n];
            const REAL *restrict vj = v + j * vs;
#pragma omp simd
            for (long p = 0; p < P; p++) row[p] += kc * vj[p];
        }
        if (o)
            for (long i = 0; i < r; i++) {
                const REAL qn = qr[i * N + n];
                REAL *restrict oi = o + i * vs;
#pragma omp simd
                for (long p = 0; p < P; p++) oi[p] += qn * row[p];
            }
    }
}

M3_INLINE void SFX(m3_fwd_item)(void **ptr, const long *sz, long bh, REAL *work, long N, long P) {
    const REAL *q = ptr[0], *k = ptr[1], *v = ptr[2], *adt = ptr[3], *cc = ptr[4], *mm = ptr[5];
    const REAL *U0 = ptr[6], *cos_th = ptr[10], *sin_th = ptr[11];
    REAL *o = ptr[7], *UL = ptr[8], *ck = ptr[9];
    const long L = sz[1], r = sz[2], H = sz[3], T = sz[6], R = sz[8];
    const long NP = N * P, nck = (L + T - 1) / T, ks = H * N, vs = H * P;
    const long b = bh / H, h = bh % H;
    REAL *U = work, *qr = U + NP, *kr = qr + r * N;
    memcpy(U, U0 + bh * NP, sizeof(REAL) * NP);
    for (long t = 0; t < L; t++) {
        if (t % T == 0) memcpy(ck + (bh * nck + t / T) * NP, U, sizeof(REAL) * NP);
        const long bt = b * L + t, g = bt * H + h;
        const long qoff = (bt * r * H + h) * N, voff = (bt * r * H + h) * P;
        const REAL *cs = cos_th + g * N, *sn = sin_th + g * N;
        SFX(m3_rot)(qr, q + qoff, ks, r, N, cs, sn);
        SFX(m3_rot)(kr, k + qoff, ks, r, N, cs, sn);
        const REAL *vt = v + voff;
        REAL *ot = o + voff;
        SFX(m3_step)(U, kr, vt, vs, qr, ot, r, N, P, exp(adt[g]), cc[g]);
        const REAL mt = mm[g];
        if (mt != 0)
            for (long i = 0; i < r; i++) {
                REAL *restrict oi = ot + i * vs;
                for (long j = 0; j < r; j++) {
                    const REAL w = -mt * SFX(m3_dot)(qr + i * N, kr + j * N, N);
                    const REAL *restrict vj = vt + j * vs;
#pragma omp simd
                    for (long p = 0; p < P; p++) oi[p] += w * vj[p];
                }
            }
    }
    memcpy(UL + bh * NP, U, sizeof(REAL) * NP);
}

/* ptr: q, k, v, adt, c, m, U0, o, UL, ck, C, S */
int SFX(m3_fwd)(void **ptr, const long *sz) {
    const long B = sz[0], r = sz[2], H = sz[3], N = sz[4], P = sz[5], R = sz[8];
    const int threads = (int)sz[7];
    int failed = 0;
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (long bh = 0; bh < B * H; bh++) {
        REAL *work = malloc(sizeof(REAL) * (N * P + 2 * r * N));
        if (!work) {
#pragma omp atomic write
            failed = 1;
            continue;
        }
        if (N == 16 && P == 16) SFX(m3_fwd_item)(ptr, sz, bh, work, 16, 16);
        else if (N == 32 && P == 32) SFX(m3_fwd_item)(ptr, sz, bh, work, 32, 32);
        else if (N == 64 && P == 64) SFX(m3_fwd_item)(ptr, sz, bh, work, 64, 64);
        else SFX(m3_fwd_item)(ptr, sz, bh, work, N, P);
        free(work);
    }
    return failed ? -1 : 0;
}

M3_INLINE void SFX(m3_bwd_item)(void **ptr, const long *sz, long bh, REAL *buf, long N, long P) {
    const REAL *q = ptr[0], *k = ptr[1], *v = ptr[2], *adt = ptr[3], *cc = ptr[4], *mm = ptr[5];
    const REAL *ck = ptr[6], *dO = ptr[7], *dUL = ptr[8], *cos_th = ptr[16], *sin_th = ptr[18];
    REAL *dq = ptr[9], *dk = ptr[10], *dv = ptr[11], *dadt = ptr[12], *dc = ptr[13];
    REAL *dm = ptr[14], *dU0 = ptr[15], *dth = ptr[17];
    const long L = sz[1], r = sz[2], H = sz[3], T = sz[6], R = sz[8];
    const long NP = N * P, nck = (L + T - 1) / T, ks = H * N, vs = H * P;
    const long b = bh / H, h = bh % H;
    /* Us: the chunk's T + 1 states; G: the adjoint; Gv (r, N) = G v_j; kG (r, P) = G^T kr_j;
     * qr, kr, dqr, dkr (r, N): the step's rotated q, k and their gradients */
    REAL *Us = buf, *G = buf + (T + 1) * NP, *Gv = G + NP, *kG = Gv + r * N;
    REAL *qr = kG + r * P, *kr = qr + r * N, *dqr = kr + r * N, *dkr = dqr + r * N;
    REAL *z = dkr + r * N;
    memcpy(G, dUL + bh * NP, sizeof(REAL) * NP);
    for (long ci = nck - 1; ci >= 0; ci--) {
        const long t0 = ci * T, t1 = t0 + T < L ? t0 + T : L;
        memcpy(Us, ck + (bh * nck + ci) * NP, sizeof(REAL) * NP);
        for (long t = t0; t < t1; t++) {
            const long bt = b * L + t, g = bt * H + h, qoff = (bt * r * H + h) * N;
            REAL *Un = Us + (t - t0 + 1) * NP;
            memcpy(Un, Un - NP, sizeof(REAL) * NP);
            SFX(m3_rot)(kr, k + qoff, ks, r, N, cos_th + g * N, sin_th + g * N);
            SFX(m3_step)(Un, kr, v + (bt * r * H + h) * P, vs, NULL, NULL, r, N, P,
                         exp(adt[g]), cc[g]);
        }
        for (long t = t1 - 1; t >= t0; t--) {
            const long bt = b * L + t, g = bt * H + h;
            const long qoff = (bt * r * H + h) * N, voff = (bt * r * H + h) * P;
            const REAL *vt = v + voff, *dot = dO + voff;
            REAL *dvt = dv + voff;
            const REAL *Ut = Us + (t - t0 + 1) * NP, *Up = Ut - NP;
            const REAL a = exp(adt[g]), c = cc[g], mt = mm[g];
            const REAL *cs = cos_th + g * N, *sn = sin_th + g * N;
            SFX(m3_rot)(qr, q + qoff, ks, r, N, cs, sn);
            SFX(m3_rot)(kr, k + qoff, ks, r, N, cs, sn);
            REAL gu = 0, gc = 0, gm = 0;
            for (long i = 0; i < r * P; i++) kG[i] = 0;
            /* rows of the state: G += sum_i qr_i do_i^T, dqr_i = U_t do_i, then the
             * update's terms with G_t, then G_{t-1} = a G_t */
            for (long n = 0; n < N; n++) {
                REAL *restrict Gn = G + n * P;
                const REAL *restrict Un = Ut + n * P, *restrict Upn = Up + n * P;
                for (long i = 0; i < r; i++) {
                    const REAL *restrict doi = dot + i * vs;
                    const REAL qn = qr[i * N + n];
                    REAL s = 0;
#pragma omp simd reduction(+ : s)
                    for (long p = 0; p < P; p++) {
                        s += Un[p] * doi[p];
                        Gn[p] += qn * doi[p];
                    }
                    dqr[i * N + n] = s;
                }
                REAL s = 0;
#pragma omp simd reduction(+ : s)
                for (long p = 0; p < P; p++) s += Gn[p] * Upn[p];
                gu += s;
                for (long j = 0; j < r; j++) {
                    const REAL *restrict vj = vt + j * vs;
                    REAL *restrict kGj = kG + j * P;
                    const REAL kn = kr[j * N + n];
                    REAL s2 = 0;
#pragma omp simd reduction(+ : s2)
                    for (long p = 0; p < P; p++) {
                        s2 += Gn[p] * vj[p];
                        kGj[p] += kn * Gn[p];
                    }
                    Gv[j * N + n] = s2;
                }
#pragma omp simd
                for (long p = 0; p < P; p++) Gn[p] *= a;
            }
            for (long j = 0; j < r; j++) {
                gc += SFX(m3_dot)(kr + j * N, Gv + j * N, N);
                REAL *restrict dkj = dkr + j * N, *restrict dvj = dvt + j * vs;
                const REAL *restrict Gvj = Gv + j * N, *restrict kGj = kG + j * P;
#pragma omp simd
                for (long n = 0; n < N; n++) dkj[n] = c * Gvj[n];
#pragma omp simd
                for (long p = 0; p < P; p++) dvj[p] = c * kGj[p];
            }
            /* the readout's term -m sum_j (qr_i . kr_j) v_j */
            for (long i = 0; i < r; i++) {
                const REAL *qi = qr + i * N, *doi = dot + i * vs;
                REAL *restrict dqi = dqr + i * N;
                for (long j = 0; j < r; j++) {
                    const REAL *kj = kr + j * N, *vj = vt + j * vs;
                    const REAL s = SFX(m3_dot)(qi, kj, N), e = SFX(m3_dot)(doi, vj, P);
                    gm -= s * e;
                    const REAL me = -mt * e, ms = -mt * s;
                    REAL *restrict dkj = dkr + j * N, *restrict dvj = dvt + j * vs;
#pragma omp simd
                    for (long n = 0; n < N; n++) {
                        dqi[n] += me * kj[n];
                        dkj[n] += me * qi[n];
                    }
#pragma omp simd
                    for (long p = 0; p < P; p++) dvj[p] += ms * doi[p];
                }
            }
            for (long n = 0; n < N; n++) z[n] = 0;
            SFX(m3_unrot)(dq + qoff, ks, dqr, qr, r, N, cs, sn, z);
            SFX(m3_unrot)(dk + qoff, ks, dkr, kr, r, N, cs, sn, z);
            for (long l = 0; l < R; l++) dth[g * R + l] = z[2 * l + 1] - z[2 * l];
            dadt[g] = a * gu;
            dc[g] = gc;
            dm[g] = gm;
        }
    }
    memcpy(dU0 + bh * NP, G, sizeof(REAL) * NP);
}

/* ptr: q, k, v, adt, c, m, ck, do, dUL, then dq, dk, dv, dadt, dc, dm, dU0, then C,
 * dtheta, S (layouts as their forward twins); sizes as the forward. */
int SFX(m3_bwd)(void **ptr, const long *sz) {
    const long B = sz[0], r = sz[2], H = sz[3], N = sz[4], P = sz[5], T = sz[6], R = sz[8];
    const int threads = (int)sz[7];
    int failed = 0;
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (long bh = 0; bh < B * H; bh++) {
        REAL *buf = malloc(sizeof(REAL) * ((T + 2) * N * P + r * (5 * N + P) + N));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
            continue;
        }
        if (N == 16 && P == 16) SFX(m3_bwd_item)(ptr, sz, bh, buf, 16, 16);
        else if (N == 32 && P == 32) SFX(m3_bwd_item)(ptr, sz, bh, buf, 32, 32);
        else if (N == 64 && P == 64) SFX(m3_bwd_item)(ptr, sz, bh, buf, 64, 64);
        else SFX(m3_bwd_item)(ptr, sz, bh, buf, N, P);
        free(buf);
    }
    return failed ? -1 : 0;
}
