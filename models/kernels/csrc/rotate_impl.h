/* Body of rotate.c for one scalar type REAL (suffix SFX); layout in rotate.c's comment. */

/* cos and sin of the angles of rows [r0, r0 + n): cs[j R + i], sn[j R + i]; libm's for a
 * block holding an angle beyond ROT_BIG_ANGLE (rotate.c) */
static void SFX(rot_cos_sin)(const REAL *theta, long st, long r0, long n, long R,
                             REAL *restrict cs, REAL *restrict sn) {
    REAL big = 0;
    for (long j = 0; j < n; j++) {
        const REAL *restrict th = theta + (r0 + j) * st;
#pragma omp simd reduction(max : big)
        for (long i = 0; i < R; i++) big = fabs(th[i]) > big ? fabs(th[i]) : big;
    }
    for (long j = 0; j < n; j++) {
        const REAL *restrict th = theta + (r0 + j) * st;
        REAL *restrict c = cs + j * R, *restrict s = sn + j * R;
        if (big > (REAL)ROT_BIG_ANGLE || big != big) {     /* or a NaN: libm's answer */
            for (long i = 0; i < R; i++) SINCOS_LIBM(th[i], s + i, c + i);
        } else {
#pragma omp simd
            for (long i = 0; i < R; i++) SINCOS(th[i], s + i, c + i);
        }
    }
}

/* y = rot(x, (c, s)) for one row; sign -1 turns back (c, -s) */
static inline void SFX(rot_row)(REAL *restrict y, const REAL *restrict x, const REAL *restrict c,
                                const REAL *restrict s, long R, long N, REAL sign) {
#pragma omp simd
    for (long i = 0; i < R; i++) {
        const REAL a = x[2 * i], b = x[2 * i + 1], si = sign * s[i];
        y[2 * i] = a * c[i] - b * si;
        y[2 * i + 1] = a * si + b * c[i];
    }
    if (N > 2 * R) memcpy(y + 2 * R, x + 2 * R, (size_t)(N - 2 * R) * sizeof(REAL));
}

/* y = rot(x + bias, (c, s)) for one row (the forward's per-head bias) */
static inline void SFX(rot_row_bias)(REAL *restrict y, const REAL *restrict x,
                                     const REAL *restrict bias, const REAL *restrict c,
                                     const REAL *restrict s, long R, long N) {
#pragma omp simd
    for (long i = 0; i < R; i++) {
        const REAL a = x[2 * i] + bias[2 * i], b = x[2 * i + 1] + bias[2 * i + 1];
        y[2 * i] = a * c[i] - b * s[i];
        y[2 * i + 1] = a * s[i] + b * c[i];
    }
#pragma omp simd
    for (long i = 2 * R; i < N; i++) y[i] = x[i] + bias[i];
}

int SFX(rot_fwd)(void **p, long *s) {
    const REAL *q = (const REAL *)p[0], *k = (const REAL *)p[1], *theta = (const REAL *)p[2];
    REAL *qr = (REAL *)p[3], *kr = (REAL *)p[4];
    const REAL *coef = (const REAL *)p[5];
    REAL *kc = (REAL *)p[6], *qk = (REAL *)p[7];
    const REAL *qb = (const REAL *)p[8], *kb = (const REAL *)p[9];   /* (hq, N) | NULL */
    const long rows = s[0], N = s[1], R = s[2], items = s[4], sq = s[5], sk = s[6], st = s[7];
    const long hq = s[8] < 1 ? 1 : s[8], sqh = s[9], skh = s[10];
    const int threads = (int)(s[3] < 1 ? 1 : s[3]);
    const long per = items > 0 ? (rows + items - 1) / items : 0;
    int failed = 0;
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long it = 0; it < items; it++) {
        REAL *buf = malloc(2 * (size_t)(ROT_BLOCK * R + 1) * sizeof(REAL));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
            continue;
        }
        REAL *cs = buf, *sn = buf + ROT_BLOCK * R + 1;
        const long r1 = (it + 1) * per < rows ? (it + 1) * per : rows;
        for (long r0 = it * per; r0 < r1; r0 += ROT_BLOCK) {
            const long n = r1 - r0 < ROT_BLOCK ? r1 - r0 : ROT_BLOCK;
            SFX(rot_cos_sin)(theta, st, r0, n, R, cs, sn);
            for (long j = 0; j < n; j++) {
                const long row = r0 + j, hd = row % hq, pos = row / hq;
                const REAL *xq_row = q + pos * sq + hd * sqh, *xk_row = k + pos * sk + hd * skh;
                if (qb)     /* q + its head's bias, turned */
                    SFX(rot_row_bias)(qr + row * N, xq_row, qb + hd * N, cs + j * R, sn + j * R, R, N);
                else
                    SFX(rot_row)(qr + row * N, xq_row, cs + j * R, sn + j * R, R, N, 1);
                if (kb)
                    SFX(rot_row_bias)(kr + row * N, xk_row, kb + hd * N, cs + j * R, sn + j * R, R, N);
                else
                    SFX(rot_row)(kr + row * N, xk_row, cs + j * R, sn + j * R, R, N, 1);
                if (coef) {         /* kc = kr coef, qk = qr . kr */
                    const REAL *restrict yq = qr + row * N, *restrict yk = kr + row * N;
                    REAL *restrict o = kc + row * N;
                    const REAL cf = coef[row];
                    REAL dot = 0;
#pragma omp simd reduction(+ : dot)
                    for (long c = 0; c < N; c++) {
                        o[c] = yk[c] * cf;
                        dot += yq[c] * yk[c];
                    }
                    qk[row] = dot;
                }
            }
        }
        free(buf);
    }
    return failed ? -1 : 0;
}

int SFX(rot_bwd)(void **p, long *s) {
    const REAL *theta = (const REAL *)p[0], *qr = (const REAL *)p[1], *kr = (const REAL *)p[2];
    const REAL *dqr = (const REAL *)p[3], *dkr = (const REAL *)p[4];
    REAL *dq = (REAL *)p[5], *dk = (REAL *)p[6], *dtheta = (REAL *)p[7];
    const REAL *coef = (const REAL *)p[8], *dkc = (const REAL *)p[9], *dqk = (const REAL *)p[10];
    REAL *dcoef = (REAL *)p[11];
    const long sdkc = s[8];
    const long rows = s[0], N = s[1], R = s[2], items = s[4], sdq = s[5], sdk = s[6], st = s[7];
    const int threads = (int)(s[3] < 1 ? 1 : s[3]);
    const long per = items > 0 ? (rows + items - 1) / items : 0;
    int failed = 0;
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long it = 0; it < items; it++) {
        REAL *buf = malloc((2 * (size_t)(ROT_BLOCK * R + 1) + 2 * (size_t)N) * sizeof(REAL));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
            continue;
        }
        REAL *cs = buf, *sn = buf + ROT_BLOCK * R + 1;
        REAL *tq = sn + ROT_BLOCK * R + 1, *tk = tq + N;   /* the folded gradients of a row */
        const long r1 = (it + 1) * per < rows ? (it + 1) * per : rows;
        for (long r0 = it * per; r0 < r1; r0 += ROT_BLOCK) {
            const long n = r1 - r0 < ROT_BLOCK ? r1 - r0 : ROT_BLOCK;
            SFX(rot_cos_sin)(theta, st, r0, n, R, cs, sn);
            for (long j = 0; j < n; j++) {
                const long row = r0 + j;
                const REAL *restrict gq = dqr + row * sdq, *restrict gk = dkr + row * sdk;
                const REAL *restrict yq = qr + row * N, *restrict yk = kr + row * N;
                if (coef) {   /* dqr += dqk kr, dkr += dkc coef + dqk qr, dcoef = dkc . kr */
                    const REAL *restrict gc = dkc + row * sdkc;
                    const REAL cf = coef[row], gd = dqk[row];
                    REAL dot = 0;
#pragma omp simd reduction(+ : dot)
                    for (long c = 0; c < N; c++) {
                        tq[c] = gq[c] + gd * yk[c];
                        tk[c] = gk[c] + gc[c] * cf + gd * yq[c];
                        dot += gc[c] * yk[c];
                    }
                    dcoef[row] = dot;
                    gq = tq;
                    gk = tk;
                }
                REAL *restrict dt = dtheta + row * R;
#pragma omp simd
                for (long i = 0; i < R; i++)
                    dt[i] = gq[2 * i + 1] * yq[2 * i] - gq[2 * i] * yq[2 * i + 1]
                          + gk[2 * i + 1] * yk[2 * i] - gk[2 * i] * yk[2 * i + 1];
                SFX(rot_row)(dq + row * N, gq, cs + j * R, sn + j * R, R, N, -1);
                SFX(rot_row)(dk + row * N, gk, cs + j * R, sn + j * R, R, N, -1);
            }
        }
        free(buf);
    }
    return failed ? -1 : 0;
}

/* Mamba-3's angles (issue 43, training at LM shapes), mamba3_scan.angles' maths in one pass
 * each way: per (batch row, head) and angle i, over the steps t,
 *   forward:  acc_i += omega_t,i dt_t;  theta_t,i = acc_i - 2 pi floor(acc_i / 2 pi)
 *             (acc from theta0; the sum kept unreduced, as the torch form's cumsum)
 *   backward: G_i += dtheta_t,i (t last first; the mod has zero gradient);
 *             domega_t,i = G_i dt_t,  ddt_t = sum_i G_i omega_t,i,  dtheta0 = G
 * rot_angles_fwd: p 0 omega, 1 dt, 2 theta0 (b, h, R) | NULL, 3 theta (b, L, h, R)
 *                 s 0 b, 1 L, 2 h, 3 R, 4-6 omega's (b, t, h) strides (angles contiguous),
 *                 7-9 dt's (b, t, h) strides, 10 threads
 * rot_angles_bwd: p 0 omega, 1 dt, 2 dtheta (b, L, h, R), 3 domega (b, L, h, R),
 *                 4 ddt (b, L, h), 5 dtheta0 (b, h, R); s as the forward (outputs contiguous)
 * Items: (batch row, head) pairs, each writing only its own rows. */
int SFX(rot_angles_fwd)(void **p, long *s) {
    const REAL *omega = (const REAL *)p[0], *dt = (const REAL *)p[1];
    const REAL *theta0 = (const REAL *)p[2];
    REAL *theta = (REAL *)p[3];
    const long B = s[0], L = s[1], H = s[2], R = s[3];
    const long so0 = s[4], so1 = s[5], so2 = s[6], sd0 = s[7], sd1 = s[8], sd2 = s[9];
    const int threads = (int)(s[10] < 1 ? 1 : s[10]);
    const REAL two_pi = (REAL)6.283185307179586;
    int failed = 0;
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long item = 0; item < B * H; item++) {
        const long bb = item / H, hh = item % H;
        double *acc = malloc((size_t)(R > 0 ? R : 1) * sizeof(double));
        if (!acc) {
#pragma omp atomic write
            failed = 1;
            continue;
        }
        for (long i = 0; i < R; i++) acc[i] = theta0 ? (double)theta0[item * R + i] : 0.0;
        for (long t = 0; t < L; t++) {
            const REAL *om = omega + bb * so0 + t * so1 + hh * so2;
            const double d = (double)dt[bb * sd0 + t * sd1 + hh * sd2];
            REAL *out = theta + ((bb * L + t) * H + hh) * R;
#pragma omp simd
            for (long i = 0; i < R; i++) {
                acc[i] += (double)om[i] * d;
                const REAL x = (REAL)acc[i];
                out[i] = x - two_pi * (REAL)floor(x / two_pi);
            }
        }
        free(acc);
    }
    return failed ? -1 : 0;
}

int SFX(rot_angles_bwd)(void **p, long *s) {
    const REAL *omega = (const REAL *)p[0], *dt = (const REAL *)p[1];
    const REAL *dtheta = (const REAL *)p[2];
    REAL *domega = (REAL *)p[3], *ddt = (REAL *)p[4], *dtheta0 = (REAL *)p[5];
    const long B = s[0], L = s[1], H = s[2], R = s[3];
    const long so0 = s[4], so1 = s[5], so2 = s[6], sd0 = s[7], sd1 = s[8], sd2 = s[9];
    const int threads = (int)(s[10] < 1 ? 1 : s[10]);
    int failed = 0;
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long item = 0; item < B * H; item++) {
        const long bb = item / H, hh = item % H;
        double *G = calloc((size_t)(R > 0 ? R : 1), sizeof(double));
        if (!G) {
#pragma omp atomic write
            failed = 1;
            continue;
        }
        for (long t = L - 1; t >= 0; t--) {
            const long row = (bb * L + t) * H + hh;
            const REAL *om = omega + bb * so0 + t * so1 + hh * so2, *dth = dtheta + row * R;
            const double d = (double)dt[bb * sd0 + t * sd1 + hh * sd2];
            REAL *dom = domega + row * R;
            double sum = 0;
#pragma omp simd reduction(+ : sum)
            for (long i = 0; i < R; i++) {
                G[i] += (double)dth[i];
                dom[i] = (REAL)(G[i] * d);
                sum += G[i] * (double)om[i];
            }
            ddt[row] = (REAL)sum;
        }
        if (dtheta0)
            for (long i = 0; i < R; i++) dtheta0[item * R + i] = (REAL)G[i];
        free(G);
    }
    return failed ? -1 : 0;
}
