/*
 * Body of rwkv7_fused.c for one scalar type: REAL, EXP, SQRT and SFX(name) are defined by
 * the includer. Rows are d_model = D = H * K wide, row-major and contiguous; accumulators
 * (acc) are added to, outputs overwritten.
 */

/* e^{-1/2}: log w = -e^{-1/2} sigmoid(z_w) */
#define RK_C0 0.60653065971263342360
/* F.normalize's eps */
#define RK_EPS 1e-12

static inline REAL SFX(rk_sigmoid)(REAL z) { return (REAL)1 / ((REAL)1 + EXP(-z)); }

/* mix_fwd  p: 0 x (n, D), 1 prev row (D: the row before x's first), 2 mu (nc, D),
 *             3 out (nc, n, D);   s: 0 n, 1 D, 2 nc */
int SFX(mix_fwd)(void **p, long *s) {
    const REAL *x = p[0], *prev = p[1], *mu = p[2];
    REAL *out = p[3];
    const long n = s[0], D = s[1], nc = s[2];
    for (long t = 0; t < n; t++) {
        const REAL *xt = x + t * D, *xs = t ? xt - D : prev;
        for (long c = 0; c < nc; c++) {
            const REAL *m = mu + c * D;
            REAL *o = out + (c * n + t) * D;
#pragma omp simd
            for (long i = 0; i < D; i++) o[i] = xt[i] + (xs[i] - xt[i]) * m[i];
        }
    }
    return 0;
}

/* mix_bwd  p: 0 x, 1 prev row, 2 mu (nc, D), 3 g (nc, n, D) the mixes' gradients,
 *             4 gx (n, D) acc, 5 g_prev row (D) acc (the row before gx's first),
 *             6 gmu (nc, D) acc;   s: 0 n, 1 D, 2 nc */
int SFX(mix_bwd)(void **p, long *s) {
    const REAL *x = p[0], *prev = p[1], *mu = p[2], *g = p[3];
    REAL *gx = p[4], *gprev = p[5], *gmu = p[6];
    const long n = s[0], D = s[1], nc = s[2];
    for (long t = 0; t < n; t++) {
        const REAL *xt = x + t * D, *xs = t ? xt - D : prev;
        REAL *gxt = gx + t * D, *gxs = t ? gxt - D : gprev;
        for (long c = 0; c < nc; c++) {
            const REAL *gc = g + (c * n + t) * D, *m = mu + c * D;
            REAL *gm = gmu + c * D;
#pragma omp simd
            for (long i = 0; i < D; i++) {
                const REAL gs = gc[i] * m[i];
                gxt[i] += gc[i] - gs;
                gxs[i] += gs;
                gm[i] += gc[i] * (xs[i] - xt[i]);
            }
        }
    }
    return 0;
}

/* prep_fwd p: 0 k, 1 z_w, 2 z_a (n, D), 3 k_k, 4 k_a (D),
 *             5 k', 6 -kk, 7 kk a, 8 log w (n, D) out;   s: 0 n, 1 D, 2 H */
int SFX(prep_fwd)(void **p, long *s) {
    const REAL *k = p[0], *zw = p[1], *za = p[2], *kk_w = p[3], *ka = p[4];
    REAL *ok = p[5], *oan = p[6], *ob = p[7], *olw = p[8];
    const long n = s[0], D = s[1], H = s[2], K = D / H;
    for (long t = 0; t < n; t++) {
        const long r0 = t * D;
        for (long h = 0; h < H; h++) {
            const long o0 = r0 + h * K;
            REAL ss = 0;
#pragma omp simd reduction(+:ss)
            for (long i = 0; i < K; i++) {
                const REAL u = k[o0 + i] * kk_w[h * K + i];
                ss += u * u;
            }
            REAL nrm = SQRT(ss);
            if (nrm < (REAL)RK_EPS) nrm = (REAL)RK_EPS;
#pragma omp simd
            for (long i = 0; i < K; i++) {
                const long j = o0 + i, c = h * K + i;
                const REAL kk = k[j] * kk_w[c] / nrm;
                const REAL a = SFX(rk_sigmoid)(za[j]);
                ok[j] = k[j] * ((a - 1) * ka[c] + 1);
                oan[j] = -kk;
                ob[j] = kk * a;
                olw[j] = -(REAL)RK_C0 * SFX(rk_sigmoid)(zw[j]);
            }
        }
    }
    return 0;
}

/* prep_bwd p: 0 k, 1 z_w, 2 z_a, 3 k_k, 4 k_a, 5 g_k', 6 g_an, 7 g_b, 8 g_lw,
 *             9 g_k, 10 g_za, 11 g_zw (n, D) out, 12 g_k_a, 13 g_k_k, 14 sum g_za,
 *             15 sum g_zw (D) acc;   s: 0 n, 1 D, 2 H */
int SFX(prep_bwd)(void **p, long *s) {
    const REAL *k = p[0], *zw = p[1], *za = p[2], *kk_w = p[3], *ka = p[4];
    const REAL *gk2 = p[5], *gan = p[6], *gb = p[7], *glw = p[8];
    REAL *gk = p[9], *gza = p[10], *gzw = p[11];
    REAL *gka = p[12], *gkk = p[13], *gab = p[14], *gb2 = p[15];
    const long n = s[0], D = s[1], H = s[2], K = D / H;
    for (long t = 0; t < n; t++) {
        const long r0 = t * D;
        for (long h = 0; h < H; h++) {
            const long o0 = r0 + h * K;
            REAL ss = 0;
#pragma omp simd reduction(+:ss)
            for (long i = 0; i < K; i++) {
                const REAL u = k[o0 + i] * kk_w[h * K + i];
                ss += u * u;
            }
            const REAL raw = SQRT(ss);
            const int clamped = raw < (REAL)RK_EPS;
            const REAL nrm = clamped ? (REAL)RK_EPS : raw;
            /* <g_kk, kk> over the head, g_kk = g_b a - g_an */
            REAL dot = 0;
#pragma omp simd reduction(+:dot)
            for (long i = 0; i < K; i++) {
                const long j = o0 + i;
                const REAL kk = k[j] * kk_w[h * K + i] / nrm;
                const REAL a = SFX(rk_sigmoid)(za[j]);
                dot += (gb[j] * a - gan[j]) * kk;
            }
            if (clamped) dot = 0;     /* the clamped norm carries no gradient */
#pragma omp simd
            for (long i = 0; i < K; i++) {
                const long j = o0 + i, c = h * K + i;
                const REAL kk = k[j] * kk_w[c] / nrm;
                const REAL a = SFX(rk_sigmoid)(za[j]);
                const REAL sw = SFX(rk_sigmoid)(zw[j]);
                const REAL g_kk = gb[j] * a - gan[j];
                const REAL g_u = (g_kk - kk * dot) / nrm;
                const REAL g_a = gb[j] * kk + gk2[j] * k[j] * ka[c];
                gk[j] = gk2[j] * ((a - 1) * ka[c] + 1) + g_u * kk_w[c];
                gka[c] += gk2[j] * k[j] * (a - 1);
                gkk[c] += g_u * k[j];
                const REAL g_za = g_a * a * (1 - a);
                const REAL g_zw = glw[j] * sw * (1 - sw) * -(REAL)RK_C0;
                gza[j] = g_za;
                gzw[j] = g_zw;
                gab[c] += g_za;
                gb2[c] += g_zw;
            }
        }
    }
    return 0;
}

/* out_fwd  p: 0 o, 1 r, 2 k, 3 v, 4 r_k (D), 5 gn_w, 6 gn_b (D), 7 gate (n, D),
 *             8 z (n, D) out, 9 mean, 10 rstd (n, H) out, 11 &eps (double);
 *          s: 0 n, 1 D, 2 H */
int SFX(out_fwd)(void **p, long *s) {
    const REAL *o = p[0], *r = p[1], *k = p[2], *v = p[3], *rk = p[4], *gw = p[5],
               *gbias = p[6], *gate = p[7];
    REAL *z = p[8], *mean_o = p[9], *rstd_o = p[10];
    const REAL eps = (REAL)*(const double *)p[11];
    const long n = s[0], D = s[1], H = s[2], K = D / H;
    for (long t = 0; t < n; t++) {
        for (long h = 0; h < H; h++) {
            const long o0 = t * D + h * K;
            REAL sum = 0, c = 0;
#pragma omp simd reduction(+:sum, c)
            for (long i = 0; i < K; i++) {
                sum += o[o0 + i];
                c += r[o0 + i] * k[o0 + i] * rk[h * K + i];
            }
            const REAL mean = sum / (REAL)K;
            REAL var = 0;
#pragma omp simd reduction(+:var)
            for (long i = 0; i < K; i++) {
                const REAL dlt = o[o0 + i] - mean;
                var += dlt * dlt;
            }
            const REAL rstd = (REAL)1 / SQRT(var / (REAL)K + eps);
            mean_o[t * H + h] = mean;
            rstd_o[t * H + h] = rstd;
#pragma omp simd
            for (long i = 0; i < K; i++) {
                const long j = o0 + i, q = h * K + i;
                z[j] = (((o[j] - mean) * rstd) * gw[q] + gbias[q] + c * v[j]) * gate[j];
            }
        }
    }
    return 0;
}

/* out_bwd  p: 0 o, 1 r, 2 k, 3 v, 4 r_k, 5 gn_w, 6 gn_b, 7 gate, 8 mean, 9 rstd,
 *             10 g_z (n, D); 11 z, 12 g_o, 13 g_r, 14 g_k, 15 g_v, 16 g_gate (n, D) out;
 *             17 g_r_k, 18 g_gn_w, 19 g_gn_b (D) acc;   s: 0 n, 1 D, 2 H */
int SFX(out_bwd)(void **p, long *s) {
    const REAL *o = p[0], *r = p[1], *k = p[2], *v = p[3], *rk = p[4], *gw = p[5],
               *gbias = p[6], *gate = p[7], *mean_i = p[8], *rstd_i = p[9], *gz = p[10];
    REAL *z = p[11], *go = p[12], *gr = p[13], *gk = p[14], *gv = p[15], *ggate = p[16];
    REAL *grk = p[17], *ggw = p[18], *ggb = p[19];
    const long n = s[0], D = s[1], H = s[2], K = D / H;
    for (long t = 0; t < n; t++) {
        for (long h = 0; h < H; h++) {
            const long o0 = t * D + h * K, q0 = h * K;
            const REAL mean = mean_i[t * H + h], rstd = rstd_i[t * H + h];
            REAL c = 0, gc = 0, m1 = 0, m2 = 0;
#pragma omp simd reduction(+:c)
            for (long i = 0; i < K; i++) c += r[o0 + i] * k[o0 + i] * rk[q0 + i];
#pragma omp simd reduction(+:gc, m1, m2)
            for (long i = 0; i < K; i++) {
                const long j = o0 + i, q = q0 + i;
                const REAL oh = (o[j] - mean) * rstd;
                const REAL pre = oh * gw[q] + gbias[q] + c * v[j];
                const REAL gpre = gz[j] * gate[j];
                z[j] = pre * gate[j];
                ggate[j] = gz[j] * pre;
                gv[j] = gpre * c;
                gc += gpre * v[j];
                ggw[q] += gpre * oh;
                ggb[q] += gpre;
                const REAL gh = gpre * gw[q];
                m1 += gh;
                m2 += gh * oh;
            }
            m1 /= (REAL)K;
            m2 /= (REAL)K;
#pragma omp simd
            for (long i = 0; i < K; i++) {
                const long j = o0 + i, q = q0 + i;
                const REAL oh = (o[j] - mean) * rstd;
                const REAL gh = gz[j] * gate[j] * gw[q];
                go[j] = (gh - m1 - oh * m2) * rstd;
                gr[j] = gc * rk[q] * k[j];
                gk[j] = gc * rk[q] * r[j];
                grk[q] += gc * r[j] * k[j];
            }
        }
    }
    return 0;
}

#undef RK_C0
#undef RK_EPS
