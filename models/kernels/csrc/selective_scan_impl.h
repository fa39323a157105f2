/*
 * Body of the fused selective scan, included by selective_scan_cpu.c once per scalar type
 * with SCALAR (float / double), EXP, LOG1P and SFX(name) (type suffix) defined.
 * Notation, layouts and argument order: see selective_scan_cpu.c.
 *
 * Every loop over l < W runs over the W channels of one tile and is what the compiler
 * vectorises (W lanes, exp() included); a tile at the end of the channel axis is padded
 * with zero lanes (delta = 0, A = 0, u = 0 keep them finite) that are never stored.
 */

static inline SCALAR SFX(sigmoid)(SCALAR x) { return 1 / (1 + EXP(-x)); }

/* softplus(x) = log(1 + e^x), = x above 20 where e^x would only lose precision */
static inline SCALAR SFX(softplus)(SCALAR x) {
    const SCALAR s = LOG1P(EXP(x < 20 ? x : 20));
    return x < 20 ? s : x;
}

typedef struct {
    const SCALAR *u, *delta, *z, *At, *B, *C, *D, *bias, *h0;
    SCALAR *out, *h_last, *ckpt;
    long batch, L, dim, N, K, n_chunks, n_tiles, softplus;
    long su_b, su_t, su_d, sd_b, sd_t, sd_d, sz_b, sz_t, sz_d, sB_b, sB_t, sC_b, sC_t;
    long so_b, so_t, so_d;     /* out, and the gradients du, ddelta, dz in backward */
    atomic_int failed;
} SFX(args_t);

/* Unpack the pointer and size arrays (order documented in selective_scan_cpu.c). */
static void SFX(unpack)(SFX(args_t) *a, void *const *p, const long *s) {
    a->u = p[0]; a->delta = p[1]; a->z = p[2]; a->At = p[3]; a->B = p[4]; a->C = p[5];
    a->D = p[6]; a->bias = p[7]; a->h0 = p[8];
    a->batch = s[0]; a->L = s[1]; a->dim = s[2]; a->N = s[3]; a->K = s[4]; a->softplus = s[5];
    a->su_b = s[6]; a->su_t = s[7]; a->su_d = s[8];
    a->sd_b = s[9]; a->sd_t = s[10]; a->sd_d = s[11];
    a->sz_b = s[12]; a->sz_t = s[13]; a->sz_d = s[14];
    a->sB_b = s[15]; a->sB_t = s[16]; a->sC_b = s[17]; a->sC_t = s[18];
    a->so_b = s[19]; a->so_t = s[20]; a->so_d = s[21];
    a->n_chunks = (a->L + a->K - 1) / a->K;
    a->n_tiles = (a->dim + W - 1) / W;
    atomic_init(&a->failed, 0);
}

/* Per-tile constants: A as (N, W) lanes, D and the delta bias as W lanes. */
static void SFX(load_tile)(const SFX(args_t) *a, long d0, long nw, SCALAR *Av, SCALAR *Dv,
                           SCALAR *biasv) {
    for (long n = 0; n < a->N; n++)
        #pragma omp simd
        for (long l = 0; l < W; l++) Av[n * W + l] = l < nw ? a->At[n * a->dim + d0 + l] : 0;
    #pragma omp simd
    for (long l = 0; l < W; l++) {
        Dv[l] = (a->D && l < nw) ? a->D[d0 + l] : 0;
        biasv[l] = (a->bias && l < nw) ? a->bias[d0 + l] : 0;
    }
}

/* Inputs of step t for a tile: u, raw delta, z (zero lanes past the channel end). */
static inline void SFX(load_step)(const SCALAR *restrict src, long stride, long nw,
                                  SCALAR *restrict dst) {
    if (stride == 1 && nw == W) {  /* time-major full tile: one vector copy */
        memcpy(dst, src, sizeof(SCALAR) * W);
        return;
    }
    for (long l = 0; l < W; l++) dst[l] = l < nw ? src[l * stride] : 0;
}

/* Store the first nw lanes of src to channels 0, stride, 2 stride, ... of dst. */
static inline void SFX(store_step)(const SCALAR *restrict src, long stride, long nw,
                                   SCALAR *restrict dst) {
    if (stride == 1) {
        memcpy(dst, src, sizeof(SCALAR) * nw);
        return;
    }
    for (long l = 0; l < nw; l++) dst[l * stride] = src[l];
}

/* h (N, W) <-> a (batch, dim, N) state tensor */
static void SFX(state_in)(const SCALAR *src, long b, long dim, long N, long d0, long nw,
                          SCALAR *h) {
    for (long n = 0; n < N; n++)
        #pragma omp simd
        for (long l = 0; l < W; l++)
            h[n * W + l] = (src && l < nw) ? src[((b * dim) + d0 + l) * N + n] : 0;
}

static void SFX(state_out)(const SCALAR *h, long b, long dim, long N, long d0, long nw,
                           SCALAR *dst) {
    for (long n = 0; n < N; n++)
        for (long l = 0; l < nw; l++) dst[((b * dim) + d0 + l) * N + n] = h[n * W + l];
}

/* ------------------------------------------------------------------------------------ */
/* forward: one work item = (batch row b, tile of W channels), the whole sequence        */

static void SFX(fwd_item)(const void *p, long item) {
    SFX(args_t) *a = (SFX(args_t) *)p;
    const long N = a->N, K = a->K, dim = a->dim;
    const long b = item / a->n_tiles, d0 = (item % a->n_tiles) * W;
    const long nw = dim - d0 < W ? dim - d0 : W;
    SCALAR *buf = aligned_alloc(64, sizeof(SCALAR) * (2 * N * W + 8 * W));
    if (!buf) { atomic_store(&a->failed, 1); return; }
    SCALAR *restrict h = buf, *restrict Av = buf + N * W, *restrict Dv = Av + N * W;
    SCALAR *restrict biasv = Dv + W, *restrict uv = biasv + W, *restrict dv = uv + W;
    SCALAR *restrict zv = dv + W, *restrict xv = zv + W, *restrict yv = xv + W;
    SFX(load_tile)(a, d0, nw, Av, Dv, biasv);
    SFX(state_in)(a->h0, b, dim, N, d0, nw, h);

    for (long t = 0; t < a->L; t++) {
        if (a->ckpt && t % K == 0) {  /* h_{t-1} at each chunk start, (batch, chunk, N, dim) */
            SCALAR *dst = a->ckpt + ((b * a->n_chunks + t / K) * N) * dim + d0;
            for (long n = 0; n < N; n++)
                for (long l = 0; l < nw; l++) dst[n * dim + l] = h[n * W + l];
        }
        SFX(load_step)(a->u + b * a->su_b + t * a->su_t + d0 * a->su_d, a->su_d, nw, uv);
        SFX(load_step)(a->delta + b * a->sd_b + t * a->sd_t + d0 * a->sd_d, a->sd_d, nw, dv);
        #pragma omp simd
        for (long l = 0; l < W; l++) {
            const SCALAR raw = dv[l] + biasv[l];
            dv[l] = a->softplus ? SFX(softplus)(raw) : raw;      /* delta_t */
            xv[l] = dv[l] * uv[l];
            yv[l] = 0;
        }
        const SCALAR *restrict Bt = a->B + b * a->sB_b + t * a->sB_t;
        const SCALAR *restrict Ct = a->C + b * a->sC_b + t * a->sC_t;
        for (long n = 0; n < N; n++) {
            const SCALAR Bn = Bt[n], Cn = Ct[n];
            SCALAR *restrict hn = h + n * W;
            const SCALAR *restrict An = Av + n * W;
            #pragma omp simd
            for (long l = 0; l < W; l++) {
                hn[l] = EXP(dv[l] * An[l]) * hn[l] + xv[l] * Bn;  /* ZOH for A, Euler for B */
                yv[l] += Cn * hn[l];
            }
        }
        SCALAR *restrict out = a->out + b * a->so_b + t * a->so_t + d0 * a->so_d;
        if (a->z) {
            SFX(load_step)(a->z + b * a->sz_b + t * a->sz_t + d0 * a->sz_d, a->sz_d, nw, zv);
            #pragma omp simd
            for (long l = 0; l < W; l++) yv[l] = (yv[l] + Dv[l] * uv[l]) * zv[l] * SFX(sigmoid)(zv[l]);
        } else {
            #pragma omp simd
            for (long l = 0; l < W; l++) yv[l] += Dv[l] * uv[l];
        }
        SFX(store_step)(yv, a->so_d, nw, out);
    }
    if (a->h_last) SFX(state_out)(h, b, dim, N, d0, nw, a->h_last);
    free(buf);
}

int SFX(ss_fwd)(void *const *p, const long *s) {
    SFX(args_t) a;
    SFX(unpack)(&a, p, s);
    a.out = p[9]; a.h_last = p[10]; a.ckpt = p[11];
    return run_items(SFX(fwd_item), &a, &a.failed, a.batch * a.n_tiles, s[22]);
}

/* ------------------------------------------------------------------------------------ */
/* backward: one work item = (batch row b, channel group) = tiles g, g + G, g + 2G, ...  */
/* Chunks run last to first; inside a chunk, every tile of the item in turn (each with   */
/* its own adjoint carry), so the lane sums of dB and dC for the chunk are accumulated  */
/* over all the item's tiles in a small (K, N, W) buffer and reduced across lanes once. */

typedef struct {
    SFX(args_t) f;
    const SCALAR *ckpt, *dout, *dh_last;
    SCALAR *du, *ddelta, *dz, *dA_part, *dD_part, *dbias_part, *dB_part, *dC_part, *dh0;
    long G, sg_b, sg_t, sg_d;  /* channel groups per batch row; dout strides */
} SFX(bwd_args_t);

/* Recompute one chunk of one tile: delta_t (T, W), y_t = C_t . h_t (T, W), the decays
 * (T, N, W) and the states hs (T + 1, N, W) from the checkpointed h_{s-1}. */
static void SFX(bwd_recompute)(const SFX(bwd_args_t) *a, long b, long c, long s, long T,
                               long d0, long nw, const SCALAR *restrict Av,
                               const SCALAR *restrict biasv, SCALAR *restrict uv,
                               SCALAR *restrict dv, SCALAR *restrict dtk, SCALAR *restrict yk,
                               SCALAR *restrict dAk, SCALAR *restrict hs) {
    const SFX(args_t) *f = &a->f;
    const long N = f->N, dim = f->dim;
    const SCALAR *src = a->ckpt + ((b * f->n_chunks + c) * N) * dim + d0;
    for (long n = 0; n < N; n++)
        #pragma omp simd
        for (long l = 0; l < W; l++) hs[n * W + l] = l < nw ? src[n * dim + l] : 0;
    for (long t = 0; t < T; t++) {
        SFX(load_step)(f->u + b * f->su_b + (s + t) * f->su_t + d0 * f->su_d, f->su_d, nw, uv);
        SFX(load_step)(f->delta + b * f->sd_b + (s + t) * f->sd_t + d0 * f->sd_d, f->sd_d, nw, dv);
        SCALAR *restrict dt = dtk + t * W, *restrict y = yk + t * W;
        #pragma omp simd
        for (long l = 0; l < W; l++) {
            const SCALAR raw = dv[l] + biasv[l];
            dt[l] = f->softplus ? SFX(softplus)(raw) : raw;
            y[l] = 0;
        }
        const SCALAR *restrict Bt = f->B + b * f->sB_b + (s + t) * f->sB_t;
        const SCALAR *restrict Ct = f->C + b * f->sC_b + (s + t) * f->sC_t;
        for (long n = 0; n < N; n++) {
            const SCALAR Bn = Bt[n], Cn = Ct[n];
            const SCALAR *restrict hp = hs + (t * N + n) * W, *restrict An = Av + n * W;
            SCALAR *restrict hc = hs + ((t + 1) * N + n) * W;
            SCALAR *restrict dA = dAk + (t * N + n) * W;
#pragma omp simd
            for (long l = 0; l < W; l++) {
                dA[l] = EXP(dt[l] * An[l]);
                hc[l] = dA[l] * hp[l] + dt[l] * uv[l] * Bn;
                y[l] += Cn * hc[l];
            }
        }
    }
}

static void SFX(bwd_item)(const void *p, long item) {
    SFX(bwd_args_t) *a = (SFX(bwd_args_t) *)p;
    const SFX(args_t) *f = &a->f;
    const long N = f->N, K = f->K, dim = f->dim, L = f->L, G = a->G;
    const long b = item / G, grp = item % G;
    const long n_mine = (f->n_tiles - grp + G - 1) / G;       /* tiles of this item */
    const long nbuf = 2 * K * W + K * N * W + (K + 1) * N * W + 2 * K * N * W
                      + n_mine * (2 * N * W + 2 * W) + N * W + 12 * W;
    SCALAR *buf = aligned_alloc(64, sizeof(SCALAR) * ((nbuf + 15) / 16 * 16));
    if (!buf) { atomic_store((atomic_int *)&f->failed, 1); return; }
    SCALAR *restrict dtk = buf;                   /* (K, W)    delta_t of the chunk */
    SCALAR *restrict yk = dtk + K * W;            /* (K, W)    C_t . h_t */
    SCALAR *restrict dAk = yk + K * W;            /* (K, N, W) exp(delta_t A) */
    SCALAR *restrict hs = dAk + K * N * W;        /* (K+1, N, W) h_{s-1} .. h_{s+T-1} */
    SCALAR *restrict dBc = hs + (K + 1) * N * W;  /* (K, N, W) lane sums of dB, this chunk */
    SCALAR *restrict dCc = dBc + K * N * W;       /* (K, N, W) same for dC */
    SCALAR *restrict g_all = dCc + K * N * W;     /* (n_mine, N, W) adjoint carries */
    SCALAR *restrict dA_all = g_all + n_mine * N * W;   /* (n_mine, N, W) dL/dA */
    SCALAR *restrict dD_all = dA_all + n_mine * N * W;  /* (n_mine, W) dL/dD */
    SCALAR *restrict dbias_all = dD_all + n_mine * W;   /* (n_mine, W) dL/d delta_bias */
    SCALAR *restrict Av = dbias_all + n_mine * W;       /* (N, W) */
    SCALAR *restrict v = Av + N * W;                    /* scratch lanes */
    SCALAR *restrict Dv = v, *restrict biasv = v + W, *restrict uv = v + 2 * W;
    SCALAR *restrict dv = v + 3 * W, *restrict zv = v + 4 * W, *restrict gov = v + 5 * W;
    SCALAR *restrict dyv = v + 6 * W, *restrict gB = v + 7 * W, *restrict gA = v + 8 * W;

    for (long j = 0; j < n_mine; j++) {
        const long d0 = (grp + j * G) * W, nw = dim - d0 < W ? dim - d0 : W;
        SFX(state_in)(a->dh_last, b, dim, N, d0, nw, g_all + j * N * W);
    }
    for (long i = 0; i < n_mine * (N * W + 2 * W); i++) dA_all[i] = 0;  /* dA, dD, dbias */

    for (long c = f->n_chunks - 1; c >= 0; c--) {
        const long s = c * K, T = L - s < K ? L - s : K;
        for (long i = 0; i < 2 * K * N * W; i++) dBc[i] = 0;           /* dBc and dCc */
        for (long j = 0; j < n_mine; j++) {
            const long d0 = (grp + j * G) * W, nw = dim - d0 < W ? dim - d0 : W;
            SCALAR *restrict g = g_all + j * N * W, *restrict dA_acc = dA_all + j * N * W;
            SCALAR *restrict dD_acc = dD_all + j * W, *restrict dbias_acc = dbias_all + j * W;
            SFX(load_tile)(f, d0, nw, Av, Dv, biasv);
            SFX(bwd_recompute)(a, b, c, s, T, d0, nw, Av, biasv, uv, dv, dtk, yk, dAk, hs);
            /* adjoint, last step first; on entry g = exp(delta_{t+1} A) g_{t+1} */
            for (long t = T - 1; t >= 0; t--) {
                const long i = s + t;
                SFX(load_step)(f->u + b * f->su_b + i * f->su_t + d0 * f->su_d, f->su_d, nw, uv);
                SFX(load_step)(a->dout + b * a->sg_b + i * a->sg_t + d0 * a->sg_d, a->sg_d, nw, gov);
                const SCALAR *restrict dt = dtk + t * W, *restrict y = yk + t * W;
                if (f->z) {  /* out = (y + D u) silu(z) */
                    SFX(load_step)(f->z + b * f->sz_b + i * f->sz_t + d0 * f->sz_d, f->sz_d, nw, zv);
                    SCALAR *restrict dz = a->dz + b * f->so_b + i * f->so_t + d0 * f->so_d;
                    #pragma omp simd
                    for (long l = 0; l < W; l++) {
                        const SCALAR sg = SFX(sigmoid)(zv[l]);  /* silu' = s (1 + z (1 - s)) */
                        dyv[l] = gov[l] * zv[l] * sg;
                        gA[l] = gov[l] * (y[l] + Dv[l] * uv[l]) * sg * (1 + zv[l] * (1 - sg));
                    }
                    SFX(store_step)(gA, f->so_d, nw, dz);
                } else {
                    #pragma omp simd
                    for (long l = 0; l < W; l++) dyv[l] = gov[l];
                }
                #pragma omp simd
                for (long l = 0; l < W; l++) { gB[l] = 0; gA[l] = 0; dD_acc[l] += dyv[l] * uv[l]; }
                const SCALAR *restrict Bt = f->B + b * f->sB_b + i * f->sB_t;
                const SCALAR *restrict Ct = f->C + b * f->sC_b + i * f->sC_t;
                for (long n = 0; n < N; n++) {
                    const SCALAR Bn = Bt[n], Cn = Ct[n];
                    const SCALAR *restrict hp = hs + (t * N + n) * W;
                    const SCALAR *restrict hc = hs + ((t + 1) * N + n) * W;
                    const SCALAR *restrict dA = dAk + (t * N + n) * W, *restrict An = Av + n * W;
                    SCALAR *restrict gn = g + n * W, *restrict dAn = dA_acc + n * W;
                    SCALAR *restrict dBt = dBc + (t * N + n) * W, *restrict dCt = dCc + (t * N + n) * W;
#pragma omp simd
                    for (long l = 0; l < W; l++) {
                        const SCALAR gt = gn[l] + Cn * dyv[l];          /* g_t = dL/dh_t */
                        const SCALAR w = gt * hp[l] * dA[l];            /* dL/d(delta_t A) */
                        gB[l] += gt * Bn;
                        gA[l] += w * An[l];
                        dAn[l] += w * dt[l];
                        dBt[l] += gt * dt[l] * uv[l];                   /* h_t has delta u B */
                        dCt[l] += dyv[l] * hc[l];                       /* y_t = C_t . h_t */
                        gn[l] = gt * dA[l];                             /* carry to t - 1 */
                    }
                }
                SCALAR *restrict du = a->du + b * f->so_b + i * f->so_t + d0 * f->so_d;
                SCALAR *restrict dd = a->ddelta + b * f->so_b + i * f->so_t + d0 * f->so_d;
                if (f->softplus)
                    SFX(load_step)(f->delta + b * f->sd_b + i * f->sd_t + d0 * f->sd_d, f->sd_d, nw, dv);
                #pragma omp simd
                for (long l = 0; l < W; l++) {
                    const SCALAR ddt = uv[l] * gB[l] + gA[l];           /* dL/d delta_t */
                    gov[l] = dyv[l] * Dv[l] + dt[l] * gB[l];            /* dL/du_t */
                    /* softplus' = sigmoid; the bias gradient sums the raw-delta gradient */
                    dv[l] = f->softplus ? ddt * SFX(sigmoid)(dv[l] + biasv[l]) : ddt;
                    dbias_acc[l] += dv[l];
                }
                SFX(store_step)(gov, f->so_d, nw, du);
                SFX(store_step)(dv, f->so_d, nw, dd);
            }
        }
        /* dB[b, t, n], dC[b, t, n] of this item: the chunk's lane sums, reduced */
        SCALAR *restrict dBo = a->dB_part + (item * L + s) * N;
        SCALAR *restrict dCo = a->dC_part + (item * L + s) * N;
        for (long i = 0; i < T * N; i++) {
            SCALAR sb = 0, sc = 0;
            #pragma omp simd
            for (long l = 0; l < W; l++) { sb += dBc[i * W + l]; sc += dCc[i * W + l]; }
            dBo[i] = sb;
            dCo[i] = sc;
        }
    }
    for (long j = 0; j < n_mine; j++) {
        const long d0 = (grp + j * G) * W, nw = dim - d0 < W ? dim - d0 : W;
        SFX(state_out)(g_all + j * N * W, b, dim, N, d0, nw, a->dh0);      /* dL/dh_{-1} */
        SFX(state_out)(dA_all + j * N * W, b, dim, N, d0, nw, a->dA_part);
        for (long l = 0; l < nw; l++) {
            a->dD_part[b * dim + d0 + l] = dD_all[j * W + l];
            a->dbias_part[b * dim + d0 + l] = dbias_all[j * W + l];
        }
    }
    free(buf);
}

int SFX(ss_bwd)(void *const *p, const long *s) {
    SFX(bwd_args_t) a;
    SFX(unpack)(&a.f, p, s);
    a.ckpt = p[11]; a.dout = p[12]; a.dh_last = p[13];
    a.du = p[14]; a.ddelta = p[15]; a.dz = p[16]; a.dA_part = p[17]; a.dD_part = p[18];
    a.dbias_part = p[19]; a.dB_part = p[20]; a.dC_part = p[21]; a.dh0 = p[22];
    a.G = s[23];
    a.sg_b = s[24]; a.sg_t = s[25]; a.sg_d = s[26];
    return run_items(SFX(bwd_item), &a, &a.f.failed, a.f.batch * a.G, s[22]);
}
