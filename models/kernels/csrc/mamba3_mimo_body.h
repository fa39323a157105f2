/* The per-step work of mamba3_mimo.c for one scalar type REAL and one vector width: VEC is
 * a vector of W REALs (W = 64 bytes / REAL: one AVX-512 register; any ISA builds through
 * GCC/Clang vector extensions) for head sizes that are multiples of W, or REAL itself with
 * W = 1 for any other size; VSFX names the copy. Every loop runs its lanes over a
 * contiguous index and keeps its sum (over ranks, or over n or p) in a register: no
 * horizontal sums per row, no row stored and reloaded once per rank. The backward keeps
 * the chunk's states and the adjoint G also transposed (P, N), so that U_t do_i and G_t v_j
 * run over contiguous n as G_t^T kr_j runs over contiguous p. */

/* One step of the state, U = a U + c sum_j kr_j v_j^T ((N, P) rows), then the r readouts
 * o_i = U^T qr_i. Every loop here runs its vector lanes over the contiguous index and its
 * sums (over j, or over n) inside a lane, so accumulators stay in registers: no horizontal
 * sums, and no row stored and reloaded once per rank. */
M3_INLINE void VSFX(m3_step)(REAL *restrict U, const REAL *restrict kr, const REAL *restrict v,
                            long vs, const REAL *restrict qr, REAL *restrict o, long r,
                            long N, long P, REAL a, REAL c) {
    /* p in blocks of PB vectors, the block's r x PB readout sums in registers while the
     * update streams the rows: one pass over U, and r PB independent sums (not r
     * dependent chains of N) */
    const long PB = P % (2 * W) == 0 ? 2 : 1;
    for (long p0 = 0; p0 < P; p0 += PB * W) {
        VEC acc[r][PB];
        for (long i = 0; i < r; i++)
            for (long b = 0; b < PB; b++) acc[i][b] = VZERO;
        for (long n = 0; n < N; n++) {
            REAL *restrict row = U + n * P + p0;
            for (long b = 0; b < PB; b++) {
                VEC x = LD(row + b * W) * a;
                for (long j = 0; j < r; j++)
                    x += LD(v + j * vs + p0 + b * W) * (c * kr[j * N + n]);
                ST(row + b * W, x);
                for (long i = 0; i < r; i++) acc[i][b] += x * qr[i * N + n];
            }
        }
        for (long i = 0; i < r; i++)
            for (long b = 0; b < PB; b++) ST(o + i * vs + p0 + b * W, acc[i][b]);
    }
}

/* The same update on the transposed state, UT (P, N) rows, into a new buffer: the backward's
 * layout, where its products with do and v run over contiguous n. */
M3_INLINE void VSFX(m3_step_t)(REAL *restrict UT, const REAL *restrict UTp,
                              const REAL *restrict kr, const REAL *restrict v, long vs, long r,
                              long N, long P, REAL a, REAL c) {
    for (long p = 0; p < P; p++) {
        for (long n = 0; n < N; n += W) {
            VEC x = LD(UTp + p * N + n) * a;
            for (long j = 0; j < r; j++) x += LD(kr + j * N + n) * (c * v[j * vs + p]);
            ST(UT + p * N + n, x);
        }
    }
}

M3_INLINE void VSFX(m3_fwd_item)(void **ptr, const long *sz, long bh, REAL *work, long N, long P,
                                long r) {
    const REAL *q = ptr[0], *k = ptr[1], *v = ptr[2], *adt = ptr[3], *cc = ptr[4], *mm = ptr[5];
    const REAL *U0 = ptr[6], *cos_th = ptr[10], *sin_th = ptr[11];
    REAL *o = ptr[7], *UL = ptr[8], *ck = ptr[9];
    const long L = sz[1], H = sz[3], T = sz[6], R = sz[8];
    const long NP = N * P, nck = (L + T - 1) / T, ks = H * N, vs = H * P;
    const long b = bh / H, h = bh % H;
    REAL *U = work, *qr = U + NP, *kr = qr + r * N, *cs = kr + r * N, *sn = cs + N;
    memcpy(U, U0 + bh * NP, sizeof(REAL) * NP);
    for (long t = 0; t < L; t++) {
        if (t % T == 0) memcpy(ck + (bh * nck + t / T) * NP, U, sizeof(REAL) * NP);
        const long bt = b * L + t, g = bt * H + h;
        const long qoff = (bt * r * H + h) * N, voff = (bt * r * H + h) * P;
        SFX(m3_spread)(cs, sn, cos_th + g * R, sin_th + g * R, R, N);
        SFX(m3_rot)(qr, q + qoff, ks, r, N, cs, sn);
        SFX(m3_rot)(kr, k + qoff, ks, r, N, cs, sn);
        const REAL *vt = v + voff;
        REAL *ot = o + voff;
        VSFX(m3_step)(U, kr, vt, vs, qr, ot, r, N, P, exp(adt[g]), cc[g]);
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

M3_INLINE void VSFX(m3_bwd_item)(void **ptr, const long *sz, long bh, REAL *buf, long N, long P,
                                long r) {
    const REAL *q = ptr[0], *k = ptr[1], *v = ptr[2], *adt = ptr[3], *cc = ptr[4], *mm = ptr[5];
    const REAL *ck = ptr[6], *dO = ptr[7], *dUL = ptr[8], *cos_th = ptr[16], *sin_th = ptr[18];
    REAL *dq = ptr[9], *dk = ptr[10], *dv = ptr[11], *dadt = ptr[12], *dc = ptr[13];
    REAL *dm = ptr[14], *dU0 = ptr[15], *dth = ptr[17];
    const long L = sz[1], H = sz[3], T = sz[6], R = sz[8];
    const long NP = N * P, nck = (L + T - 1) / T, ks = H * N, vs = H * P;
    const long b = bh / H, h = bh % H;
    /* Us: the chunk's T + 1 states, transposed (P, N); G and GT: the adjoint in both layouts;
     * Gv (r, N) = G v_j; kG (r, P) = G^T kr_j; qr, kr, dqr, dkr (r, N): the step's rotated
     * q, k and their gradients; z (N): theta's gradient before its pair difference */
    REAL *Us = buf, *G = buf + (T + 1) * NP, *GT = G + NP, *Gv = GT + NP, *kG = Gv + r * N;
    REAL *qr = kG + r * P, *kr = qr + r * N, *dqr = kr + r * N, *dkr = dqr + r * N;
    REAL *z = dkr + r * N, *cs = z + N, *sn = cs + N;
    memcpy(G, dUL + bh * NP, sizeof(REAL) * NP);
    REAL anext = 1;                 /* the decay of the step after the current one (none: 1) */
    for (long n = 0; n < N; n++)
        for (long p = 0; p < P; p++) GT[p * N + n] = G[n * P + p];
    for (long ci = nck - 1; ci >= 0; ci--) {
        const long t0 = ci * T, t1 = t0 + T < L ? t0 + T : L;
        const REAL *c0 = ck + (bh * nck + ci) * NP;
        for (long n = 0; n < N; n++)
            for (long p = 0; p < P; p++) Us[p * N + n] = c0[n * P + p];
        for (long t = t0; t < t1; t++) {
            const long bt = b * L + t, g = bt * H + h, qoff = (bt * r * H + h) * N;
            REAL *Un = Us + (t - t0 + 1) * NP;
            SFX(m3_spread)(cs, sn, cos_th + g * R, sin_th + g * R, R, N);
            SFX(m3_rot)(kr, k + qoff, ks, r, N, cs, sn);
            VSFX(m3_step_t)(Un, Un - NP, kr, v + (bt * r * H + h) * P, vs, r, N, P,
                           exp(adt[g]), cc[g]);
        }
        for (long t = t1 - 1; t >= t0; t--) {
            const long bt = b * L + t, g = bt * H + h;
            const long qoff = (bt * r * H + h) * N, voff = (bt * r * H + h) * P;
            const REAL *restrict vt = v + voff, *restrict dot = dO + voff;
            REAL *dvt = dv + voff;
            const REAL *restrict UTt = Us + (t - t0 + 1) * NP, *restrict UTp = UTt - NP;
            const REAL a = exp(adt[g]), c = cc[g], mt = mm[g];
            SFX(m3_spread)(cs, sn, cos_th + g * R, sin_th + g * R, R, N);
            SFX(m3_rot)(qr, q + qoff, ks, r, N, cs, sn);
            SFX(m3_rot)(kr, k + qoff, ks, r, N, cs, sn);
            /* G_t = a_{t+1} G_{t+1} + sum_i qr_i do_i^T in both layouts (G_{t+1} stored
             * unscaled, anext = a_{t+1}), each pass with the products that read it: in the
             * transposed one <G_t, U_{t-1}> (exp(adt)'s gradient), dqr_i = U_t do_i and
             * Gv_j = G_t v_j (lanes over n); in the row one kG_j = G_t^T kr_j (lanes over p) */
            VEC su = VZERO;
            for (long n = 0; n < N; n += W) {
                VEC x[r], y[r];
                for (long i = 0; i < r; i++) x[i] = y[i] = VZERO;
                for (long p = 0; p < P; p++) {
                    VEC gt = LD(GT + p * N + n) * anext;
                    for (long i = 0; i < r; i++) gt += LD(qr + i * N + n) * dot[i * vs + p];
                    ST(GT + p * N + n, gt);
                    su += gt * LD(UTp + p * N + n);
                    const VEC u = LD(UTt + p * N + n);
                    for (long i = 0; i < r; i++) {
                        x[i] += u * dot[i * vs + p];
                        y[i] += gt * vt[i * vs + p];
                    }
                }
                for (long i = 0; i < r; i++) {
                    ST(dqr + i * N + n, x[i]);
                    ST(Gv + i * N + n, y[i]);
                }
            }
            const REAL gu = HSUM(su);
            for (long p = 0; p < P; p += W) {
                VEC x[r];
                for (long j = 0; j < r; j++) x[j] = VZERO;
                for (long n = 0; n < N; n++) {
                    VEC g = LD(G + n * P + p) * anext;
                    for (long i = 0; i < r; i++) g += LD(dot + i * vs + p) * qr[i * N + n];
                    ST(G + n * P + p, g);
                    for (long j = 0; j < r; j++) x[j] += g * kr[j * N + n];
                }
                for (long j = 0; j < r; j++) ST(kG + j * P + p, x[j]);
            }
            anext = a;
            REAL gc = 0, gm = 0;
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
    for (long e = 0; e < NP; e++) dU0[bh * NP + e] = anext * G[e];    /* a_1 G_1 */
}

