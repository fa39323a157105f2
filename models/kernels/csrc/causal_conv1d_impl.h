/*
 * Causal depthwise 1-D convolution with optional SiLU, time-major, included by
 * cpu_kernels.c once per scalar type (SCALAR, EXP, SFX defined there):
 *
 *   pre[b, t, d] = bias[d] + sum_{j < k} w[j, d] * x[b, t - (k - 1) + j, d]
 *   out          = silu(pre)  (or pre)
 *
 * x[b, t', d] for t' < 0 comes from ``left`` (the previous k - 1 inputs, (batch, k-1, dim))
 * or is zero. This is the Mamba block's conv (kernel d_conv = 4) in the layout the block
 * produces, so no transposes; causal_conv1d's CUDA kernel does the same job on GPUs.
 *
 * p (pointers): 0 x, 1 wt (k, dim), 2 bias|NULL, 3 left|NULL, 4 out;
 *               backward adds 5 dout, 6 dx, 7 dwt_part (batch, k, dim), 8 dbias_part
 *               (batch, dim), 9 dleft|NULL (batch, k-1, dim), 10 work (batch, L, dim)
 * s (sizes):    0 batch, 1 L, 2 dim, 3 k, 4 silu, 5-6 x strides (b, t), 7 threads
 * x's channel axis must be contiguous; out, dout, dx are (batch, L, dim) contiguous.
 * One work item = one batch row.
 */

typedef struct {
    const SCALAR *x, *wt, *bias, *left, *dout;
    SCALAR *out, *dx, *dwt, *dbias, *dleft, *work;
    long batch, L, dim, k, silu, sx_b, sx_t;
} SFX(conv_args_t);

/* row t' of the padded input of batch row b: x, or ``left`` before t = 0, or NULL (zeros) */
static inline const SCALAR *SFX(conv_row)(const SFX(conv_args_t) *a, long b, long t) {
    if (t >= 0) return a->x + b * a->sx_b + t * a->sx_t;
    if (!a->left) return NULL;
    return a->left + (b * (a->k - 1) + (a->k - 1 + t)) * a->dim;
}

/* pre-activation of row t into acc (dim) */
static inline void SFX(conv_pre)(const SFX(conv_args_t) *a, long b, long t, SCALAR *restrict acc) {
    const long dim = a->dim;
    for (long d = 0; d < dim; d++) acc[d] = a->bias ? a->bias[d] : 0;
    for (long j = 0; j < a->k; j++) {
        const SCALAR *restrict xr = SFX(conv_row)(a, b, t - (a->k - 1) + j);
        if (!xr) continue;
        const SCALAR *restrict wj = a->wt + j * dim;
        for (long d = 0; d < dim; d++) acc[d] += wj[d] * xr[d];
    }
}

static void SFX(conv_fwd_item)(const void *p, long b) {
    const SFX(conv_args_t) *a = (const SFX(conv_args_t) *)p;
    const long dim = a->dim;
    for (long t = 0; t < a->L; t++) {
        SCALAR *restrict o = a->out + (b * a->L + t) * dim;
        SFX(conv_pre)(a, b, t, o);
        if (a->silu)
            for (long d = 0; d < dim; d++) o[d] = o[d] / (1 + EXP(-o[d]));
    }
}

static void SFX(conv_bwd_item)(const void *p, long b) {
    const SFX(conv_args_t) *a = (const SFX(conv_args_t) *)p;
    const long dim = a->dim, L = a->L, k = a->k;
    SCALAR *restrict dwt = a->dwt + b * k * dim, *restrict dbias = a->dbias + b * dim;
    for (long i = 0; i < k * dim; i++) dwt[i] = 0;
    for (long d = 0; d < dim; d++) dbias[d] = 0;
    /* gp[t] = dL/dpre[t] (in work), with the weight and bias gradients */
    for (long t = 0; t < L; t++) {
        SCALAR *restrict gp = a->work + (b * L + t) * dim;
        const SCALAR *restrict go = a->dout + (b * L + t) * dim;
        if (a->silu) {
            SFX(conv_pre)(a, b, t, gp);
            for (long d = 0; d < dim; d++) {
                const SCALAR sg = 1 / (1 + EXP(-gp[d]));   /* silu' = s (1 + x (1 - s)) */
                gp[d] = go[d] * sg * (1 + gp[d] * (1 - sg));
            }
        } else {
            for (long d = 0; d < dim; d++) gp[d] = go[d];
        }
        for (long d = 0; d < dim; d++) dbias[d] += gp[d];
        for (long j = 0; j < k; j++) {
            const SCALAR *restrict xr = SFX(conv_row)(a, b, t - (k - 1) + j);
            if (!xr) continue;
            SCALAR *restrict dwj = dwt + j * dim;
            for (long d = 0; d < dim; d++) dwj[d] += gp[d] * xr[d];
        }
    }
    /* dx[t'] = sum_j w[j] gp[t' + (k - 1) - j] for t' in [-(k-1), L) (t' < 0: dleft) */
    for (long tp = -(k - 1); tp < L; tp++) {
        SCALAR *restrict dst;
        if (tp >= 0) dst = a->dx + (b * L + tp) * dim;
        else if (a->dleft) dst = a->dleft + (b * (k - 1) + (k - 1 + tp)) * dim;
        else continue;
        for (long d = 0; d < dim; d++) dst[d] = 0;
        for (long j = 0; j < k; j++) {
            const long t = tp + (k - 1) - j;
            if (t < 0 || t >= L) continue;
            const SCALAR *restrict gp = a->work + (b * L + t) * dim, *restrict wj = a->wt + j * dim;
            for (long d = 0; d < dim; d++) dst[d] += wj[d] * gp[d];
        }
    }
}

static void SFX(conv_unpack)(SFX(conv_args_t) *a, void *const *p, const long *s) {
    a->x = p[0]; a->wt = p[1]; a->bias = p[2]; a->left = p[3]; a->out = p[4];
    a->batch = s[0]; a->L = s[1]; a->dim = s[2]; a->k = s[3]; a->silu = s[4];
    a->sx_b = s[5]; a->sx_t = s[6];
}

int SFX(conv_fwd)(void *const *p, const long *s) {
    SFX(conv_args_t) a;
    SFX(conv_unpack)(&a, p, s);
    run_parallel(SFX(conv_fwd_item), &a, a.batch, (int)s[7]);
    return 0;
}

int SFX(conv_bwd)(void *const *p, const long *s) {
    SFX(conv_args_t) a;
    SFX(conv_unpack)(&a, p, s);
    a.dout = p[5]; a.dx = p[6]; a.dwt = p[7]; a.dbias = p[8]; a.dleft = p[9]; a.work = p[10];
    run_parallel(SFX(conv_bwd_item), &a, a.batch, (int)s[7]);
    return 0;
}
