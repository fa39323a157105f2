/*
 * The decode step of linear_rnn_step.c for one scalar type: included once per REAL (float,
 * double) with SFX naming the entry point. The maths, the sizes and the pointers are in
 * linear_rnn_step.c's comments.
 */

typedef struct {
    const REAL *y, *S, *W2, *b2, *nw, *nb, *decay;
    REAL *S2, *out;
    const long long *pos;
    const double *inv_freq;
    double scale, eps, normalizer, la_eps;
    long H, K, V, Vs, mode, ldy, off_q, off_k, off_v, off_gate, off_low, R, phi, normalize, norm;
} SFX(lrs_args);

static inline REAL SFX(lrs_silu)(REAL x) { return x / ((REAL)1 + (REAL)exp(-(double)x)); }

/* logsigmoid(x) = min(x, 0) - log1p(exp(-|x|)), PyTorch's stable form */
static inline REAL SFX(lrs_logsigmoid)(REAL x) {
    const REAL m = x < 0 ? x : (REAL)0;
    return m - (REAL)log1p(exp(-fabs((double)x)));
}

static void SFX(lrs_item)(const SFX(lrs_args) *a, long item) {
    const long K = a->K, V = a->V, Vs = a->Vs, H = a->H;
    const long b = item / H, h = item % H;
    const REAL *yr = a->y + b * a->ldy;
    const REAL *qs = yr + a->off_q + h * K, *ks = yr + a->off_k + h * K;
    const REAL *vs = yr + a->off_v + h * V;
    REAL q[LRS_MAXD], k[LRS_MAXD], dec[LRS_MAXD], v[LRS_MAXD], acc[LRS_MAXD];
    int has_decay = 1;

    if (a->mode == LRS_GLA) {
        const REAL *low = yr + a->off_low;
        for (long i = 0; i < K; i++) {
            const REAL *w = a->W2 + (h * K + i) * a->R;
            REAL s = 0;
            for (long r = 0; r < a->R; r++) s += w[r] * low[r];
            const REAL gk = s + a->b2[h * K + i];
            const REAL g = SFX(lrs_logsigmoid)(gk) / (REAL)a->normalizer;
            dec[i] = (REAL)exp((double)g);
            q[i] = qs[i];
            k[i] = ks[i];
        }
    } else if (a->mode == LRS_RETENTION) {
        const long half = K / 2;
        const double p = (double)a->pos[b];
        for (long j = 0; j < half; j++) {
            const double ang = p * a->inv_freq[j];
            const REAL c = (REAL)cos(ang), s = (REAL)sin(ang);
            q[j] = qs[j] * c - qs[j + half] * s;
            q[j + half] = qs[j] * s + qs[j + half] * c;
            k[j] = ks[j] * c - ks[j + half] * s;
            k[j + half] = ks[j] * s + ks[j + half] * c;
        }
        for (long i = 0; i < K; i++) dec[i] = a->decay[h];
    } else {                                             /* linear attention: phi(q), phi(k) */
        for (long i = 0; i < K; i++) {
            if (a->phi) {                                /* elu(x) + 1 */
                q[i] = (qs[i] > 0 ? qs[i] : (REAL)expm1((double)qs[i])) + (REAL)1;
                k[i] = (ks[i] > 0 ? ks[i] : (REAL)expm1((double)ks[i])) + (REAL)1;
            } else {
                q[i] = qs[i];
                k[i] = ks[i];
            }
        }
        has_decay = 0;
    }
    for (long j = 0; j < V; j++) v[j] = vs[j];
    for (long j = V; j < Vs; j++) v[j] = (REAL)1;        /* the normaliser's ones column */

    /* S' = diag(a) S + k v^T and o = S'^T q in one pass over the rows of S */
    for (long j = 0; j < Vs; j++) acc[j] = 0;
    const long base = (b * H + h) * K * Vs;
    for (long i = 0; i < K; i++) {
        const REAL *Si = a->S + base + i * Vs;
        REAL *Si2 = a->S2 + base + i * Vs;
        const REAL di = has_decay ? dec[i] : (REAL)1, ki = k[i], qi = q[i];
        #pragma omp simd
        for (long j = 0; j < Vs; j++) {
            const REAL s = di * Si[j] + ki * v[j];
            Si2[j] = s;
            acc[j] += qi * s;
        }
    }
    REAL *o = a->out + b * H * V + h * V;
    const REAL scale = (REAL)a->scale;
    for (long j = 0; j < Vs; j++) acc[j] *= scale;
    if (a->mode == LRS_LINEAR && a->normalize) {
        const REAL den = acc[V] + (REAL)a->la_eps;
        for (long j = 0; j < V; j++) acc[j] = acc[j] / den;
    }

    if (a->norm == NORM_RMS) {
        double ss = 0;
        for (long j = 0; j < V; j++) ss += (double)acc[j] * acc[j];
        const REAL r = (REAL)(1.0 / sqrt(ss / (double)V + a->eps));
        for (long j = 0; j < V; j++) acc[j] = (acc[j] * r) * a->nw[j];
    } else if (a->norm == NORM_GROUP) {
        double mean = 0, var = 0;
        for (long j = 0; j < V; j++) mean += acc[j];
        mean /= (double)V;
        for (long j = 0; j < V; j++) var += (acc[j] - mean) * (acc[j] - mean);
        const double rstd = 1.0 / sqrt(var / (double)V + a->eps);
        for (long j = 0; j < V; j++)
            acc[j] = (REAL)((acc[j] - mean) * rstd) * a->nw[h * V + j] + a->nb[h * V + j];
    }
    if (a->mode != LRS_LINEAR) {                         /* the swish output gate */
        const REAL *gate = yr + a->off_gate + h * V;
        for (long j = 0; j < V; j++) acc[j] = acc[j] * SFX(lrs_silu)(gate[j]);
    }
    for (long j = 0; j < V; j++) o[j] = acc[j];
}

int SFX(lrs_step)(void **p, long *s) {
    SFX(lrs_args) a;
    const double *scal = (const double *)p[4];
    a.y = (const REAL *)p[0];
    a.S = (const REAL *)p[1];
    a.S2 = (REAL *)p[2];
    a.out = (REAL *)p[3];
    a.scale = scal[0];
    a.eps = scal[1];
    a.normalizer = scal[2];
    a.la_eps = scal[3];
    a.W2 = (const REAL *)p[5];
    a.b2 = (const REAL *)p[6];
    a.nw = (const REAL *)p[7];
    a.nb = (const REAL *)p[8];
    a.pos = (const long long *)p[9];
    a.inv_freq = (const double *)p[10];
    a.decay = (const REAL *)p[11];
    const long B = s[0];
    a.H = s[1]; a.K = s[2]; a.V = s[3]; a.Vs = s[4]; a.mode = s[5]; a.ldy = s[6];
    a.off_q = s[7]; a.off_k = s[8]; a.off_v = s[9]; a.off_gate = s[10]; a.off_low = s[11];
    a.R = s[12]; a.phi = s[13]; a.normalize = s[14]; a.norm = s[15];
    const long threads = s[16];
    if (a.K > LRS_MAXD || a.Vs > LRS_MAXD) return -2;
    const long items = B * a.H;
    /* a thread team costs more than a small step's arithmetic: only for large batches */
    const int par = threads > 1 && items > 1 && items * a.K * a.Vs >= (1L << 16);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (par)
    for (long it = 0; it < items; it++) SFX(lrs_item)(&a, it);
#else
    (void)par;
    for (long it = 0; it < items; it++) SFX(lrs_item)(&a, it);
#endif
    return 0;
}
