/*
 * The decode step of delta_rule_step.c for one scalar type: included once per REAL (float,
 * double) with SFX naming the entry point. The maths, the sizes and the pointers are in
 * delta_rule_step.c's comments.
 */

typedef struct {
    const REAL *y, *S, *cache, *cw, *cb, *A_log, *dt_bias, *nw, *fk, *gt;
    REAL *S2, *out, *act, *cache2;
    double scale, eps;
    long B, H, Hv, dk, dv, n, W, ldy, off_qkv, off_b, off_a, off_g, neg, C;
} SFX(drs_args);

static inline REAL SFX(drs_silu)(REAL x) { return x * SIGMOID(x); }

/* softplus with PyTorch's threshold: x above 20 is returned as is */
static inline REAL SFX(drs_softplus)(REAL x) {
    return x > (REAL)20 ? x : (REAL)log1p(exp((double)x));
}

/* x <- x / max(|x|, 1e-12) over d entries */
static void SFX(drs_l2norm)(REAL *x, long d) {
    REAL ss = 0;
    for (long i = 0; i < d; i++) ss += x[i] * x[i];
    REAL nrm = (REAL)sqrt((double)ss);
    if (nrm < (REAL)1e-12) nrm = (REAL)1e-12;
    for (long i = 0; i < d; i++) x[i] = x[i] / nrm;
}

/* phase 1, batch row b: conv + SiLU of the q, k, v channels into act, the new cache,
 * then the L2 norms of the q and k heads */
static void SFX(drs_row)(const SFX(drs_args) *a, long b) {
    const long C = a->C, W = a->W, W1 = W > 0 ? W - 1 : 0;
    const REAL *yr = a->y + b * a->ldy + a->off_qkv;
    REAL *act = a->act + b * C;
    if (W == 4) {             /* the default kernel size, unrolled so the loop vectorises */
        const REAL *cr = a->cache + b * C * 3, *f = a->cw, *cb = a->cb;
        REAL *cr2 = a->cache2 + b * C * 3;
        /* the bias test outside the loop: a masked load from a NULL bias is slow */
#define DRS_CONV4(BIAS)                                                                      \
        _Pragma("omp simd")                                                                  \
        for (long c = 0; c < C; c++) {                                                       \
            const REAL w0 = cr[3 * c], w1 = cr[3 * c + 1], w2 = cr[3 * c + 2], x = yr[c];   \
            const REAL s = BIAS + w0 * f[4 * c] + w1 * f[4 * c + 1] + w2 * f[4 * c + 2]      \
                           + x * f[4 * c + 3];                                               \
            cr2[3 * c] = w1;                                                                 \
            cr2[3 * c + 1] = w2;                                                             \
            cr2[3 * c + 2] = x;                                                              \
            act[c] = SFX(drs_silu)(s);                                                       \
        }
        if (cb) {
            DRS_CONV4(cb[c])
        } else {
            DRS_CONV4((REAL)0)
        }
#undef DRS_CONV4
    } else if (W > 0) {
        const REAL *cr = a->cache + b * C * W1;
        REAL *cr2 = a->cache2 + b * C * W1;
        for (long c = 0; c < C; c++) {
            const REAL *win = cr + c * W1, *f = a->cw + c * W;
            REAL s = a->cb ? a->cb[c] : (REAL)0;
            for (long w = 0; w < W1; w++) s += win[w] * f[w];
            act[c] = s + yr[c] * f[W1];
            REAL *win2 = cr2 + c * W1;
            for (long w = 0; w + 1 < W1; w++) win2[w] = win[w + 1];
            if (W1 > 0) win2[W1 - 1] = yr[c];
        }
        #pragma omp simd
        for (long c = 0; c < C; c++) act[c] = SFX(drs_silu)(act[c]);
    } else {
        #pragma omp simd
        for (long c = 0; c < C; c++) act[c] = SFX(drs_silu)(yr[c]);
    }
    const long heads = a->H * (1 + a->n);              /* q heads, then n rows of k heads */
    for (long i = 0; i < heads; i++) SFX(drs_l2norm)(act + i * a->dk, a->dk);
}

/* phase 2, work item (batch row b, value head hv) */
static void SFX(drs_item)(const SFX(drs_args) *a, long item) {
    const long Hv = a->Hv, dk = a->dk, dv = a->dv, n = a->n;
    const long b = item / Hv, hv = item % Hv, h = hv / (Hv / a->H);
    const long Kd = a->H * dk, Vd = Hv * dv;
    const REAL *yr = a->y + b * a->ldy;
    const REAL *act = a->act + b * a->C;
    const REAL *q = act + h * dk;
    REAL u[DRS_MAXD], err[DRS_MAXD];

    REAL decay = 1;
    REAL dkey[DRS_MAXD];       /* KDA: the decay per key channel (fk non-NULL) */
    if (a->fk) {
        const REAL *f = a->fk + (b * Hv + hv) * dk, *db = a->dt_bias + hv * dk;
        const double A = exp((double)a->A_log[hv]);
        for (long i = 0; i < dk; i++)
            dkey[i] = (REAL)exp(-A * (double)SFX(drs_softplus)(f[i] + db[i]));
    } else if (a->off_a >= 0) {
        const REAL sp = SFX(drs_softplus)(yr[a->off_a + hv] + a->dt_bias[hv]);
        decay = (REAL)exp(-exp((double)a->A_log[hv]) * (double)sp);
    }
    const long base = (b * Hv + hv) * dk * dv;
    const REAL *S = a->S + base;
    REAL *S2 = a->S2 + base;

    /* pass 0: S' = decay S and u = S'^T k_0 */
    const REAL *k0 = act + Kd + h * dk;
    for (long j = 0; j < dv; j++) u[j] = 0;
    for (long i = 0; i < dk; i++) {
        const REAL *Si = S + i * dv;
        REAL *S2i = S2 + i * dv;
        const REAL ki = k0[i];
        if (a->fk) decay = dkey[i];
        #pragma omp simd
        for (long j = 0; j < dv; j++) {
            const REAL s = decay * Si[j];
            S2i[j] = s;
            u[j] += ki * s;
        }
    }
    /* the n writes, each fused with the next row's S^T k (or the readout S^T q) */
    for (long r = 0; r < n; r++) {
        const REAL *kr = act + Kd + r * Kd + h * dk;
        const REAL *vr = act + Kd + n * Kd + r * Vd + hv * dv;
        REAL beta = SIGMOID(yr[a->off_b + r * Hv + hv]);
        if (a->neg) beta = beta * (REAL)2;
        for (long j = 0; j < dv; j++) {
            err[j] = beta * (vr[j] - u[j]);
            u[j] = 0;
        }
        const REAL *next = r + 1 < n ? act + Kd + (r + 1) * Kd + h * dk : q;
        for (long i = 0; i < dk; i++) {
            REAL *S2i = S2 + i * dv;
            const REAL ki = kr[i], ni = next[i];
            #pragma omp simd
            for (long j = 0; j < dv; j++) {
                const REAL s = S2i[j] + ki * err[j];
                S2i[j] = s;
                u[j] += ni * s;
            }
        }
    }
    /* o = scale S'^T q, rmsnorm, weight, gate */
    const REAL scale = (REAL)a->scale;
    double ss = 0;
    for (long j = 0; j < dv; j++) {
        u[j] *= scale;
        ss += (double)u[j] * u[j];
    }
    const REAL rr = (REAL)(1.0 / sqrt(ss / (double)dv + a->eps));
    REAL *o = a->out + b * Vd + hv * dv;
    if (a->gt) {               /* KDA: sigmoid of the gate passed apart */
        const REAL *g = a->gt + b * Vd + hv * dv;
        #pragma omp simd
        for (long j = 0; j < dv; j++) o[j] = (u[j] * rr) * a->nw[j] * SIGMOID(g[j]);
    } else if (a->off_g >= 0) {
        const REAL *g = yr + a->off_g + hv * dv;
        #pragma omp simd
        for (long j = 0; j < dv; j++) o[j] = (u[j] * rr) * a->nw[j] * SFX(drs_silu)(g[j]);
    } else {
        for (long j = 0; j < dv; j++) o[j] = (u[j] * rr) * a->nw[j];
    }
}

int SFX(drs_step)(void **p, long *s) {
    SFX(drs_args) a;
    const double *scal = (const double *)p[12];
    a.y = (const REAL *)p[0];
    a.S = (const REAL *)p[1];
    a.S2 = (REAL *)p[2];
    a.out = (REAL *)p[3];
    a.act = (REAL *)p[4];
    a.cache = (const REAL *)p[5];
    a.cache2 = (REAL *)p[6];
    a.cw = (const REAL *)p[7];
    a.cb = (const REAL *)p[8];
    a.A_log = (const REAL *)p[9];
    a.dt_bias = (const REAL *)p[10];
    a.nw = (const REAL *)p[11];
    a.fk = (const REAL *)p[13];
    a.gt = (const REAL *)p[14];
    a.scale = scal[0];
    a.eps = scal[1];
    a.B = s[0]; a.H = s[1]; a.Hv = s[2]; a.dk = s[3]; a.dv = s[4]; a.n = s[5]; a.W = s[6];
    a.ldy = s[7]; a.off_qkv = s[8]; a.off_b = s[9]; a.off_a = s[10]; a.off_g = s[11];
    a.neg = s[12];
    const long threads = s[13];
    if (a.dk > DRS_MAXD || a.dv > DRS_MAXD) return -2;
    if (a.H < 1 || a.Hv % a.H) return -3;
    a.C = a.H * a.dk * (1 + a.n) + a.Hv * a.dv * a.n;
    const long items = a.B * a.Hv;
    /* a thread team costs more than a small step's arithmetic: only for large batches */
    const int par = threads > 1 && items > 1 && items * a.dk * a.dv * (a.n + 1) >= (1L << 16);
    if (!par) {                 /* no thread team (its start costs a small step's time) */
        for (long b = 0; b < a.B; b++) SFX(drs_row)(&a, b);
        for (long it = 0; it < items; it++) SFX(drs_item)(&a, it);
        return 0;
    }
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (long b = 0; b < a.B; b++) SFX(drs_row)(&a, b);
#pragma omp for schedule(static)
        for (long it = 0; it < items; it++) SFX(drs_item)(&a, it);
    }
    return 0;
}
