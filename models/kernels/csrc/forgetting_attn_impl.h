/*
 * Body of forgetting_attn.c, included once per scalar type with REAL, EXPNEG (exp of a
 * non-positive number) and SFX(name) defined. Layout (all contiguous, bh = batch * heads):
 *   q, out, dout, dq : (bh, nq, D)      the queries are the last nq of the nk positions
 *   k, v             : (bh, nk, D)      D % 16 == 0 (the caller pads with zeros)
 *   kt, vt, dk, dv   : (bh, D, ldk)     k, v and their gradients transposed, zero past
 *                                       nk; ldk % JT == 0
 *   c, dc            : (bh, nk) float64 c_t = sum_{l <= t} log f_l, and dLoss/dc
 *   lse              : (bh, nq)         log sum_j exp(z_ij), saved by the forward
 * Precision: z_ij's decay part is taken as (c_i - c_p0) + (c_p0 - c_j) from float64 c,
 * p0 the block's first query position, so in float32 its error is relative to the decay
 * of the pairs that carry weight, not to |c| (which grows with the position).
 */

#define VEC SFX(vec)
#define VL ((long)(sizeof(VEC) / sizeof(REAL)))       /* lanes: 16 floats, 8 doubles */
#define LOADV(ptr) (*(const VEC *)(ptr))
#define STOREV(ptr, x) (*(VEC *)(ptr) = (x))

/* S[r * ldk + j] = Qs_r . k_j for the BQ rows of Qs (BQ x D) and keys j < n16 of Kt
 * (D x ldk): one vector of keys at a time, its BQ accumulators in registers */
static inline __attribute__((always_inline)) void SFX(fa_scores)(
    const REAL *restrict Qs, const REAL *restrict Kt, long ldk, long n16, long D,
    REAL *restrict S)
{
    for (long j0 = 0; j0 < n16; j0 += VL) {
        VEC acc[BQ];
        for (int r = 0; r < BQ; r++) acc[r] = (VEC){0};
        for (long d = 0; d < D; d++) {
            const VEC kt = LOADV(Kt + d * ldk + j0);
            for (int r = 0; r < BQ; r++) acc[r] += Qs[r * D + d] * kt;
        }
        for (int r = 0; r < BQ; r++) STOREV(S + r * ldk + j0, acc[r]);
    }
}

/* out_r = mul_r sum_{j < n} W[r * ldk + j] x_j for the first nr of the BQ rows (x: n x D
 * row-major): one vector of columns at a time, the BQ accumulators in registers */
static inline __attribute__((always_inline)) void SFX(fa_rows_times)(
    const REAL *restrict W, long ldk, const REAL *restrict x, long n, long D,
    REAL *restrict out, long nr, const REAL *mul)
{
    for (long d0 = 0; d0 < D; d0 += VL) {
        VEC acc[BQ];
        for (int r = 0; r < BQ; r++) acc[r] = (VEC){0};
        for (long j = 0; j < n; j++) {
            const VEC xj = LOADV(x + j * D + d0);
            for (int r = 0; r < BQ; r++) acc[r] += W[r * ldk + j] * xj;
        }
        for (long r = 0; r < nr; r++) STOREV(out + r * D + d0, acc[r] * mul[r]);
    }
}

/* accT[d][j] += sum_r W[r * ldk + j] x_r[d] for keys j < n16 (accT: D x ldk, the gradient
 * of the keys or values transposed): a vector of keys of the BQ rows of W stays in
 * registers and every d reuses it */
static inline __attribute__((always_inline)) void SFX(fa_cols_times)(
    const REAL *restrict W, long ldk, const REAL *restrict x, long n16, long D,
    REAL *restrict accT)
{
    for (long j0 = 0; j0 < n16; j0 += VL) {
        VEC w[BQ];
        for (int r = 0; r < BQ; r++) w[r] = LOADV(W + r * ldk + j0);
        for (long d = 0; d < D; d++) {
            VEC s = LOADV(accT + d * ldk + j0);
            for (int r = 0; r < BQ; r++) s += x[r * D + d] * w[r];
            STOREV(accT + d * ldk + j0, s);
        }
    }
}

typedef struct {
    const REAL *q, *k, *kt, *v, *vt, *out, *lse, *dout;
    const double *c;
    REAL *out_w, *lse_w, *dq, *dk, *dv;
    double *dc;
    long nq, nk, ldk, nblk;
    REAL scale;
} SFX(fa_args);

/* The block's scaled queries (rows past nr zero) and the key part of the decay bias. */
static inline __attribute__((always_inline)) void SFX(fa_block_setup)(
    const REAL *q, long nr, long D, REAL scale, const double *c, long p0, long nkeys,
    REAL *Qs, REAL *kb)
{
    for (int r = 0; r < BQ; r++)
        for (long d = 0; d < D; d++) Qs[r * D + d] = r < nr ? q[r * D + d] * scale : 0;
    const double cp0 = c[p0];
    for (long j = 0; j < nkeys; j++) kb[j] = (REAL)(cp0 - c[j]);
}

static inline __attribute__((always_inline)) void SFX(fa_fwd_item)(
    const SFX(fa_args) *a, long item, long D, REAL *S, REAL *kb)
{
    const long bh = item / a->nblk, i0 = (item % a->nblk) * BQ;
    const long nr = a->nq - i0 < BQ ? a->nq - i0 : BQ;
    const long p0 = a->nk - a->nq + i0, nkeys = p0 + nr, n16 = (nkeys + JT - 1) / JT * JT;
    const long ldk = a->ldk;
    const double *c = a->c + bh * a->nk;
    REAL Qs[BQ * DMAX];
    SFX(fa_block_setup)(a->q + (bh * a->nq + i0) * D, nr, D, a->scale, c, p0, nkeys, Qs, kb);
    SFX(fa_scores)(Qs, a->kt + bh * D * ldk, ldk, n16, D, S);
    REAL inv[BQ];
    for (int r = 0; r < BQ; r++) {
        REAL *restrict s = S + r * ldk;
        if (r >= nr) {                       /* past the last query: no weight */
            memset(s, 0, n16 * sizeof(REAL));
            continue;
        }
        const long p = p0 + r;
        const REAL rb = (REAL)(c[p] - c[p0]);
        REAL m = -INFINITY;
#pragma omp simd reduction(max : m)
        for (long j = 0; j <= p; j++) {
            const REAL z = s[j] + rb + kb[j];
            s[j] = z;
            m = z > m ? z : m;
        }
        REAL l = 0;
#pragma omp simd reduction(+ : l)
        for (long j = 0; j <= p; j++) {
            const REAL e = EXPNEG(s[j] - m);
            s[j] = e;
            l += e;
        }
        for (long j = p + 1; j < n16; j++) s[j] = 0;       /* causal: keys after p */
        inv[r] = 1 / l;
        a->lse_w[bh * a->nq + i0 + r] = m + (REAL)log((double)l);
    }
    SFX(fa_rows_times)(S, ldk, a->v + bh * a->nk * D, nkeys, D,
                       a->out_w + (bh * a->nq + i0) * D, nr, inv);
}

static inline __attribute__((always_inline)) void SFX(fa_bwd_item)(
    const SFX(fa_args) *a, long bh, long D, REAL *S, REAL *dS, REAL *kb)
{
    const long nq = a->nq, nk = a->nk, ldk = a->ldk;
    const double *c = a->c + bh * nk;
    double *dc = a->dc + bh * nk;
    REAL *dkT = a->dk + bh * D * ldk, *dvT = a->dv + bh * D * ldk;
    const REAL *k = a->k + bh * nk * D;
    memset(dkT, 0, D * ldk * sizeof(REAL));
    memset(dvT, 0, D * ldk * sizeof(REAL));
    memset(dc, 0, nk * sizeof(double));
    for (long blk = 0; blk < a->nblk; blk++) {
        const long i0 = blk * BQ, nr = nq - i0 < BQ ? nq - i0 : BQ;
        const long p0 = nk - nq + i0, nkeys = p0 + nr, n16 = (nkeys + JT - 1) / JT * JT;
        const long row0 = bh * nq + i0;
        REAL Qs[BQ * DMAX], dO[BQ * DMAX], Drow[BQ];
        SFX(fa_block_setup)(a->q + row0 * D, nr, D, a->scale, c, p0, nkeys, Qs, kb);
        for (int r = 0; r < BQ; r++) {
            REAL dd = 0;
            for (long d = 0; d < D; d++) {
                const REAL g = r < nr ? a->dout[(row0 + r) * D + d] : 0;
                dO[r * D + d] = g;
                dd += r < nr ? g * a->out[(row0 + r) * D + d] : 0;
            }
            Drow[r] = dd;                                       /* D_i = dO_i . o_i */
        }
        SFX(fa_scores)(Qs, a->kt + bh * D * ldk, ldk, n16, D, S);      /* q_i . k_j  */
        SFX(fa_scores)(dO, a->vt + bh * D * ldk, ldk, n16, D, dS);     /* dO_i . v_j */
        for (int r = 0; r < BQ; r++) {
            REAL *restrict s = S + r * ldk, *restrict ds = dS + r * ldk;
            if (r >= nr) {
                memset(s, 0, n16 * sizeof(REAL));
                memset(ds, 0, n16 * sizeof(REAL));
                continue;
            }
            const long p = p0 + r;
            const REAL rb = (REAL)(c[p] - c[p0]), lse = a->lse[row0 + r], Dr = Drow[r];
            REAL rowsum = 0;
#pragma omp simd reduction(+ : rowsum)
            for (long j = 0; j <= p; j++) {
                const REAL pij = EXPNEG(s[j] + rb + kb[j] - lse);
                const REAL g = pij * (ds[j] - Dr);              /* dz_ij */
                s[j] = pij;
                ds[j] = g;
                rowsum += g;
            }
            for (long j = p + 1; j < n16; j++) s[j] = ds[j] = 0;  /* causal; padding */
            dc[p] += rowsum;                                    /* dz_ij / dc_i = +1 */
        }
        /* dq_i = scale sum_j dz_ij k_j */
        REAL scale_r[BQ];
        for (int r = 0; r < BQ; r++) scale_r[r] = a->scale;
        SFX(fa_rows_times)(dS, ldk, k, nkeys, D, a->dq + row0 * D, nr, scale_r);
        /* dk_j += sum_i dz_ij scale q_i, dv_j += sum_i P_ij dO_i (both transposed) */
        SFX(fa_cols_times)(dS, ldk, Qs, n16, D, dkT);
        SFX(fa_cols_times)(S, ldk, dO, n16, D, dvT);
        for (long j = 0; j < nkeys; j++) {                      /* dz_ij / dc_j = -1 */
            REAL col = 0;
            for (int r = 0; r < BQ; r++) col += dS[r * ldk + j];
            dc[j] -= col;
        }
    }
}

/* Run item(args, i, D, buffers) for i < n_items, each thread with its own score buffers;
 * D = 16, 32, 64 are compiled with the head dimension known, any other D generically. */
#define FA_DISPATCH(call)                                                              \
    switch (D) {                                                                       \
    case 16: { const long D = 16; call; } break;                                       \
    case 32: { const long D = 32; call; } break;                                       \
    case 64: { const long D = 64; call; } break;                                       \
    default: call;                                                                     \
    }

static int SFX(fa_unpack)(void **p, const long *s, SFX(fa_args) *a, long *D, int *threads) {
    memset(a, 0, sizeof(*a));
    a->nq = s[1];
    a->nk = s[2];
    *D = s[3];
    a->ldk = s[4];
    *threads = (int)s[5];
    a->nblk = (a->nq + BQ - 1) / BQ;
    a->scale = (REAL)(*(const double *)p[0]);
    return *D <= DMAX && *D % 16 == 0 && a->ldk % JT == 0 && a->ldk >= a->nk;
}

/* forward. p: 0 &scale (double), 1 q, 2 kt, 3 v, 4 c, 5 out, 6 lse;
 * s: 0 bh, 1 nq, 2 nk, 3 D, 4 ldk, 5 threads. Returns 0, -1 (no memory), -2 (bad sizes). */
int SFX(fa_fwd)(void **p, const long *s) {
    SFX(fa_args) a;
    long D;
    int n_threads, status = 0;
    if (!SFX(fa_unpack)(p, s, &a, &D, &n_threads)) return -2;
    a.q = p[1]; a.kt = p[2]; a.v = p[3]; a.c = p[4]; a.out_w = p[5]; a.lse_w = p[6];
    const long n_items = s[0] * a.nblk;
#ifdef _OPENMP
#pragma omp parallel num_threads(n_threads)
#endif
    {
        REAL *S = malloc((size_t)BQ * a.ldk * sizeof(REAL)), *kb = malloc(a.ldk * sizeof(REAL));
        if (!S || !kb) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            status = -1;
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 4)
#endif
        for (long i = 0; i < n_items; i++)
            if (S && kb) FA_DISPATCH(SFX(fa_fwd_item)(&a, i, D, S, kb));
        free(S);
        free(kb);
    }
    return status;
}

/* backward. p: 0 &scale, 1 q, 2 k, 3 kt, 4 v, 5 vt, 6 c, 7 out, 8 lse, 9 dout, 10 dq, 11 dk,
 * 12 dv, 13 dc; s as the forward's. */
int SFX(fa_bwd)(void **p, const long *s) {
    SFX(fa_args) a;
    long D;
    int n_threads, status = 0;
    if (!SFX(fa_unpack)(p, s, &a, &D, &n_threads)) return -2;
    a.q = p[1]; a.k = p[2]; a.kt = p[3]; a.v = p[4]; a.vt = p[5]; a.c = p[6]; a.out = p[7];
    a.lse = p[8]; a.dout = p[9]; a.dq = p[10]; a.dk = p[11]; a.dv = p[12]; a.dc = p[13];
    const long n_items = s[0];
#ifdef _OPENMP
#pragma omp parallel num_threads(n_threads)
#endif
    {
        REAL *S = malloc((size_t)BQ * a.ldk * sizeof(REAL));
        REAL *dS = malloc((size_t)BQ * a.ldk * sizeof(REAL)), *kb = malloc(a.ldk * sizeof(REAL));
        if (!S || !dS || !kb) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            status = -1;
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (long i = 0; i < n_items; i++)
            if (S && dS && kb) FA_DISPATCH(SFX(fa_bwd_item)(&a, i, D, S, dS, kb));
        free(S);
        free(dS);
        free(kb);
    }
    return status;
}

#undef FA_DISPATCH
#undef VEC
#undef VL
#undef LOADV
#undef STOREV
