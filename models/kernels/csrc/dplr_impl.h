/*
 * Body of the generalised (diagonal-plus-low-rank) delta-rule kernel: RWKV-7 and Kimi
 * Delta Attention (models/kernels/generalized_delta.py, the torch side in
 * models/kernels/generalized_delta_cpu.py). Included by cpu_kernels.c once per scalar type
 * with SCALAR, EXP and SFX(name) defined, AFTER linear_rnn_impl.h: it reuses that file's
 * tile type and helpers (SFX(vec_t), ld / st, lrnn_part, lrnn_padded, lrnn_rowsums,
 * lrnn_buffer, lrnn_pad / lrnn_unpad, lrnn_prefetch).
 *
 * One recurrence over a (K, V) state per batch row b and head h, t = 0..T-1 (fla's layout):
 *
 *   u_t = S_{t-1}^T a_t                               (V)
 *   S_t = diag(w_t) S_{t-1} + b_t u_t^T + k_t v_t^T   w_t = exp(gk_t), one per key row
 *   o_t = scale S_t^T q_t
 *
 * RWKV-7 takes it as is; KDA (kda = 1) is the case a_t = w_t o k_t, b_t = -beta_t k_t,
 * k_t -> beta_t k_t, formed here per step from k_t, beta_t (one number) and g_t = gk_t, and
 * the gradients mapped back: dk = beta (dk' - db) + w o da, dbeta = k . (dk' - db),
 * dg = dgk + w o k o da (forming a, b, k' as tensors in torch cost KDA a third more time).
 *
 * Why a recurrence and not chunks: the chunked form's (chunk, chunk) matmuls and triangular
 * solves run far below a CPU's large-GEMM speed (linear_rnn_impl.h says the same for the
 * delta rules); here the state stays in L1 and each step is a few passes over it with the
 * tiles of a row group in registers. Per state element and step: forward 5 FMAs (u, the
 * three-term update, o), backward 10 after recomputing the forward.
 *
 * Backward, by hand. With dS = dL/dS_t gathered from the future, per step, last first:
 *   dS   += scale q_t do_t^T;          dq_t = scale S_t do_t
 *   dk_t  = dS v_t;   dv_t = dS^T k_t;  db_t = dS u_t;   du = dS^T b_t
 *   dw_i  = sum_j dS_ij S_{t-1,ij};     dgk_t = w_t o dw
 *   da_t  = S_{t-1} du;                 dS <- diag(w_t) dS + a_t du^T    (now dL/dS_{t-1})
 * Two passes over the rows per step: pass A (dS += q do^T, the row sums dq, dk, db and the
 * column sums dv, du), pass B (needs all of du: the row sums da, dw and the new dS). Pass
 * B of step t and pass A of step t - 1 run in one sweep over the rows (one read and write
 * of dS per step, not two: the backward 10% faster, 98 -> 89 ms at the bench's shapes).
 * Columns never mix, so groups of up to 4 tiles of columns are independent (only the row
 * sums add up over groups). The states S_{t-1}, S_t come from the forward's checkpoints:
 * the state before every chunk of C steps is stored, and the backward recomputes one chunk
 * at a time into a (C + 1, K, Vp) buffer, with u_t for each step.
 *
 * Layout: q, k, a, b, gk (B, T, H, K), v (B, T, H, V) read through (batch, time, head)
 * strides with a contiguous last axis (KDA: a unused, b = beta (B, T, H)). Outputs
 * contiguous:
 *   o, do, dv: (B, T, H, V); dq, dk, da, db, dgk: (B, T, H, K) (KDA: da unused, db =
 *   dbeta (B, T, H), dgk = dg)
 *   h0, S_last, dS_last, dh0: (B, H, K, V); ckpt: (B, H, n_chunks, K, Vp) (padded rows)
 *
 * Entry points (arrays, as the other kernels'):
 *   p: 0 q, 1 k, 2 v, 3 a, 4 b, 5 gk, 6 h0|NULL, 7 scale (one SCALAR), 8 o, 9 S_last,
 *      10 ckpt|NULL (forward: NULL = no backward will follow);
 *      backward adds 11 do, 12 dS_last|NULL, 13 dq, 14 dk, 15 dv, 16 da, 17 db, 18 dgk,
 *      19 dh0
 *   s: 0 B, 1 T, 2 H, 3 K, 4 V, 5 C (steps per chunk), 6 threads, 7-9 q strides
 *      (b, t, h), 10-12 k, 13-15 v, 16-18 a, 19-21 b, 22-24 gk, 25 kda (0/1),
 *      26 l2norm (0/1: q and k divided by max(|x|, 1e-12) per step inside the kernel, as
 *      fla's use_qk_l2norm_in_kernel, before KDA's a, b, k' are formed from k; the
 *      backward maps dq, dk back through it (linear_rnn_impl.h's lrnn_l2 / lrnn_l2_back),
 *      so autograd keeps the raw q, k and no normalised copies)
 * Returns 0, or -1 when a work buffer cannot be allocated.
 */

#define LT LRNN_LT
#define DPLR_PREFETCH 8
#define VEC SFX(vec_t)

typedef struct {
    const SCALAR *q, *k, *v, *a, *b, *gk, *h0;
    SCALAR scale;
    SCALAR *o, *S_last, *ckpt;
    const SCALAR *d_o, *dS_last;
    SCALAR *dq, *dk, *dv, *da, *db, *dgk, *dh0;
    long B, T, H, K, V, Vp, C, n_chunks, kda, l2norm;
    long st[6][3];          /* (batch, time, head) strides of q, k, v, a, b, gk */
    atomic_int failed;
} SFX(dplr_args_t);

static void SFX(dplr_unpack)(SFX(dplr_args_t) *x, void *const *p, const long *s,
                             int backward) {
    x->q = p[0]; x->k = p[1]; x->v = p[2]; x->a = p[3]; x->b = p[4]; x->gk = p[5];
    x->h0 = p[6];
    x->scale = *(const SCALAR *)p[7];
    x->o = p[8]; x->S_last = p[9]; x->ckpt = p[10];
    x->d_o = backward ? p[11] : NULL; x->dS_last = backward ? p[12] : NULL;
    x->dq = backward ? p[13] : NULL; x->dk = backward ? p[14] : NULL;
    x->dv = backward ? p[15] : NULL; x->da = backward ? p[16] : NULL;
    x->db = backward ? p[17] : NULL; x->dgk = backward ? p[18] : NULL;
    x->dh0 = backward ? p[19] : NULL;
    x->B = s[0]; x->T = s[1]; x->H = s[2]; x->K = s[3]; x->V = s[4]; x->C = s[5];
    x->Vp = (x->V + LT - 1) / LT * LT;
    for (int m = 0; m < 6; m++)
        for (int i = 0; i < 3; i++) x->st[m][i] = s[7 + 3 * m + i];
    x->n_chunks = (x->T + x->C - 1) / x->C;
    x->kda = s[25];
    x->l2norm = s[26];
    atomic_init(&x->failed, 0);
}

/* element (b, t, h) of input m (0 q, 1 k, 2 v, 3 a, 4 b, 5 gk) */
#define DAT(x, ptr, m, bb, t, h) \
    ((ptr) + (bb) * (x)->st[m][0] + (t) * (x)->st[m][1] + (h) * (x)->st[m][2])

/* What step t reads besides the state. */
typedef struct {
    const SCALAR *q, *k, *a, *b, *v;   /* v: in place when V fills whole tiles, else vbuf */
    SCALAR *vbuf, *w;                  /* w (K): exp(gk_t) */
    SCALAR *kbuf;                      /* KDA: a, b, k' formed here (3 K); else unused */
    const SCALAR *kraw;                /* KDA: k_t as given (l2norm: normalised) */
    SCALAR beta;                       /* KDA: beta_t */
    SCALAR *qn, *kn;                   /* l2norm: the normalised q_t, k_t (K each) */
    SCALAR q_norm, k_norm;             /* l2norm: max(|q_t|, eps), max(|k_t|, eps) */
} SFX(dplr_in_t);

static void SFX(dplr_load)(const SFX(dplr_args_t) *x, long bb, long t, long h,
                           SFX(dplr_in_t) *in) {
    if (t + DPLR_PREFETCH < x->T) {    /* rows a (time) stride apart: help the prefetcher */
        const long tp = t + DPLR_PREFETCH;
        SFX(lrnn_prefetch)(DAT(x, x->q, 0, bb, tp, h), x->K, 0);
        SFX(lrnn_prefetch)(DAT(x, x->k, 1, bb, tp, h), x->K, 0);
        SFX(lrnn_prefetch)(DAT(x, x->v, 2, bb, tp, h), x->V, 0);
        if (!x->kda) {
            SFX(lrnn_prefetch)(DAT(x, x->a, 3, bb, tp, h), x->K, 0);
            SFX(lrnn_prefetch)(DAT(x, x->b, 4, bb, tp, h), x->K, 0);
        }
        SFX(lrnn_prefetch)(DAT(x, x->gk, 5, bb, tp, h), x->K, 0);
    }
    in->q = DAT(x, x->q, 0, bb, t, h);
    in->k = DAT(x, x->k, 1, bb, t, h);
    if (!x->kda) {
        in->a = DAT(x, x->a, 3, bb, t, h);
        in->b = DAT(x, x->b, 4, bb, t, h);
    }
    in->v = SFX(lrnn_padded)(DAT(x, x->v, 2, bb, t, h), in->vbuf, x->V, x->Vp);
    const SCALAR *g_t = DAT(x, x->gk, 5, bb, t, h);
    #pragma omp simd
    for (long i = 0; i < x->K; i++) in->w[i] = EXP(g_t[i]);
    if (x->l2norm) {
        in->q_norm = SFX(lrnn_l2)(in->q, in->qn, x->K);
        in->k_norm = SFX(lrnn_l2)(in->k, in->kn, x->K);
        in->q = in->qn;
        in->k = in->kn;
    }
    if (x->kda) {   /* a = w o k, b = -beta k, k' = beta k */
        const SCALAR beta = *DAT(x, x->b, 4, bb, t, h), *k = in->k;
        SCALAR *a = in->kbuf, *b = a + x->K, *kk = b + x->K;
        #pragma omp simd
        for (long i = 0; i < x->K; i++) {
            a[i] = in->w[i] * k[i];
            kk[i] = beta * k[i];
            b[i] = -kk[i];
        }
        in->kraw = k;
        in->beta = beta;
        in->a = a;
        in->b = b;
        in->k = kk;
    }
}

/* One step from src to dst (K, Vp; the same pointer for a step in place) over the nt tiles
 * from column j0: pass 1 u = S^T a (all rows read before any is written), pass 2 the
 * update with o's sums. upad (Vp): u_t kept for the backward (or NULL); opad: o_t (or
 * NULL). Rows in the inner loop, two at a time with two sums (half the dependency chain). */
static inline __attribute__((always_inline)) void
SFX(dplr_step_group)(const SFX(dplr_args_t) *x, SCALAR *dst, const SCALAR *src,
                     const SFX(dplr_in_t) *in, SCALAR *restrict upad, SCALAR *restrict opad,
                     long j0, const int nt) {
    const long K = x->K, Vp = x->Vp;
    const SCALAR *restrict q_t = in->q, *restrict k_t = in->k, *restrict a_t = in->a;
    const SCALAR *restrict b_t = in->b, *restrict w_t = in->w;
    VEC vv[4], u[4], o0[4], o1[4];
    for (int j = 0; j < nt; j++) {
        vv[j] = SFX(ld)(in->v + j0 + j * LT);
        u[j] = (VEC){0};
        o0[j] = (VEC){0};
        o1[j] = (VEC){0};
    }
    long i = 0;
    for (; i + 1 < K; i += 2) {         /* o0, o1 serve as u's second sums here */
        const SCALAR *s0 = src + i * Vp + j0, *s1 = s0 + Vp;
        for (int j = 0; j < nt; j++) {
            u[j] += a_t[i] * SFX(ld)(s0 + j * LT);
            o1[j] += a_t[i + 1] * SFX(ld)(s1 + j * LT);
        }
    }
    if (i < K)
        for (int j = 0; j < nt; j++) u[j] += a_t[i] * SFX(ld)(src + i * Vp + j0 + j * LT);
    for (int j = 0; j < nt; j++) {
        u[j] += o1[j];
        o1[j] = (VEC){0};
        if (upad) SFX(st)(upad + j0 + j * LT, u[j]);
    }
    for (i = 0; i + 1 < K; i += 2) {
        const SCALAR *s0 = src + i * Vp + j0, *s1 = s0 + Vp;
        SCALAR *d0 = dst + i * Vp + j0, *d1 = d0 + Vp;
        for (int j = 0; j < nt; j++) {
            const VEC y0 = SFX(ld)(s0 + j * LT), y1 = SFX(ld)(s1 + j * LT);
            const VEC x0 = w_t[i] * y0 + b_t[i] * u[j] + k_t[i] * vv[j];
            const VEC x1 = w_t[i + 1] * y1 + b_t[i + 1] * u[j] + k_t[i + 1] * vv[j];
            SFX(st)(d0 + j * LT, x0);
            SFX(st)(d1 + j * LT, x1);
            o0[j] += q_t[i] * x0;
            o1[j] += q_t[i + 1] * x1;
        }
    }
    if (i < K) {
        const SCALAR *s0 = src + i * Vp + j0;
        for (int j = 0; j < nt; j++) {
            const VEC x0 = w_t[i] * SFX(ld)(s0 + j * LT) + b_t[i] * u[j] + k_t[i] * vv[j];
            SFX(st)(dst + i * Vp + j0 + j * LT, x0);
            o0[j] += q_t[i] * x0;
        }
    }
    if (opad)
        for (int j = 0; j < nt; j++) SFX(st)(opad + j0 + j * LT, x->scale * (o0[j] + o1[j]));
}

static void SFX(dplr_step)(const SFX(dplr_args_t) *x, SCALAR *dst, const SCALAR *src,
                           const SFX(dplr_in_t) *in, SCALAR *restrict upad,
                           SCALAR *restrict opad) {
    LRNN_GROUPS(x->Vp, SFX(dplr_step_group)(x, dst, src, in, upad, opad, j0, NT));
}

static void SFX(dplr_fwd_item)(const void *args, long item) {
    SFX(dplr_args_t) *x = (SFX(dplr_args_t) *)args;
    const long bb = item / x->H, h = item % x->H, K = x->K, V = x->V, Vp = x->Vp;
    const long KVp = K * Vp;
    SCALAR *buf = SFX(lrnn_buffer)(KVp + 2 * Vp + 6 * K);
    if (!buf) { atomic_store(&x->failed, 1); return; }
    SCALAR *S = buf, *vpad = S + KVp, *opad = vpad + Vp, *w = opad + Vp;
    SFX(dplr_in_t) in = {.vbuf = vpad, .w = w, .kbuf = w + K, .qn = w + 4 * K,
                         .kn = w + 5 * K};
    const int padded = V != Vp;   /* else o_t is written in place */
    if (x->h0) SFX(lrnn_pad)(S, x->h0 + item * K * V, K, V, Vp);
    for (long t = 0; t < x->T; t++) {
        SFX(lrnn_ckpt_store)(x->ckpt, S, item, x->n_chunks, x->C, t, KVp);
        SFX(dplr_load)(x, bb, t, h, &in);
        SCALAR *o_t = x->o + ((bb * x->T + t) * x->H + h) * V;
        SFX(dplr_step)(x, S, S, &in, NULL, padded ? opad : o_t);
        if (padded) memcpy(o_t, opad, sizeof(SCALAR) * V);
    }
    SFX(lrnn_unpad)(x->S_last + item * K * V, S, K, V, Vp);
    free(buf);
}

/* What a backward pass reads and writes for one step (pointers into the item's buffers).
 * Pass A of step t uses St (= S_t), q, k, b, v, U (= u_t), dop and writes dv, du; pass B
 * uses Sp (= S_{t-1}), a, w and reads du. */
typedef struct {
    const SCALAR *St, *Sp, *U;          /* S_t, S_{t-1} (K, Vp), u_t (Vp) */
    const SCALAR *q, *k, *a, *b, *w, *v, *dop;
    SCALAR *dv, *du;                    /* (Vp) each */
} SFX(dplr_bstep_t);

/* The row sums' per-lane parts (K16, LT each; rows past K zero), and dS (K, Vp). */
typedef struct {
    SCALAR *dS, *Pq, *Pk, *Pb, *Pa, *Pg;
    SCALAR scale;
} SFX(dplr_bacc_t);

/* The backward passes over the nt tiles from column j0 (nt a constant at every call, so
 * the tile loops unroll), rows in the outer loop:
 *   B (yb, step t):   da = S_{t-1} du; dw = sum_j dS S_{t-1}; dS <- diag(w) dS + a du^T
 *   A (ya, step t'):  dS += scale q do^T; dq = S_t' do; dk = dS v; db = dS u;
 *                     dv = dS^T k; du = dS^T b
 * With both (yb for step t, ya for t' = t - 1) a row is done by B and then at once by A:
 * S_{t-1} is B's Sp and A's St, and dS is read and written once per step instead of twice.
 * Columns never mix, so the groups of tiles are independent; only the row sums add up
 * over groups (first: the first group of the step, which starts the sums). */
static inline __attribute__((always_inline)) void
SFX(dplr_bwd_group)(const SFX(dplr_args_t) *x, const SFX(dplr_bacc_t) *z,
                    const SFX(dplr_bstep_t) *yb, const SFX(dplr_bstep_t) *ya, long j0,
                    const int nt, const int first) {
    const long K = x->K, Vp = x->Vp;
    VEC dub[4] = {0}, dov[4] = {0}, vv[4] = {0}, uu[4] = {0}, dvs[4] = {0}, dus[4] = {0};
    for (int j = 0; j < nt; j++) {
        if (yb) dub[j] = SFX(ld)(yb->du + j0 + j * LT);
        if (ya) {
            dov[j] = SFX(ld)(ya->dop + j0 + j * LT);
            vv[j] = SFX(ld)(ya->v + j0 + j * LT);
            uu[j] = SFX(ld)(ya->U + j0 + j * LT);
            dvs[j] = (VEC){0};
            dus[j] = (VEC){0};
        }
    }
    for (long i = 0; i < K; i++) {
        SCALAR *dSi = z->dS + i * Vp + j0;
        VEC d[4];
        for (int j = 0; j < nt; j++) d[j] = SFX(ld)(dSi + j * LT);
        if (yb) {
            const SCALAR *Spi = yb->Sp + i * Vp + j0;
            const SCALAR wi = yb->w[i], ai = yb->a[i];
            VEC aa = {0}, ag = {0};
            for (int j = 0; j < nt; j++) {
                const VEC sp = SFX(ld)(Spi + j * LT);
                aa += sp * dub[j];
                ag += d[j] * sp;
                d[j] = wi * d[j] + ai * dub[j];
            }
            SFX(lrnn_part)(z->Pa + i * LT, aa, first);
            SFX(lrnn_part)(z->Pg + i * LT, ag, first);
        }
        if (ya) {
            const SCALAR *Sti = ya->St + i * Vp + j0;
            const SCALAR sq = z->scale * ya->q[i], ki = ya->k[i], bi = ya->b[i];
            VEC aq = {0}, ak = {0}, ab = {0};
            for (int j = 0; j < nt; j++) {
                d[j] += sq * dov[j];
                aq += SFX(ld)(Sti + j * LT) * dov[j];
                ak += d[j] * vv[j];
                ab += d[j] * uu[j];
                dvs[j] += ki * d[j];
                dus[j] += bi * d[j];
            }
            SFX(lrnn_part)(z->Pq + i * LT, aq, first);
            SFX(lrnn_part)(z->Pk + i * LT, ak, first);
            SFX(lrnn_part)(z->Pb + i * LT, ab, first);
        }
        for (int j = 0; j < nt; j++) SFX(st)(dSi + j * LT, d[j]);
    }
    if (ya)
        for (int j = 0; j < nt; j++) {
            SFX(st)(ya->dv + j0 + j * LT, dvs[j]);
            SFX(st)(ya->du + j0 + j * LT, dus[j]);
        }
}

/* one backward sweep over the state's columns: pass B of yb's step and/or pass A of ya's */
static void SFX(dplr_bwd_sweep)(const SFX(dplr_args_t) *x, const SFX(dplr_bacc_t) *z,
                                const SFX(dplr_bstep_t) *yb, const SFX(dplr_bstep_t) *ya) {
#define DPLR_SWEEP                                                               \
    if (yb && ya) SFX(dplr_bwd_group)(x, z, yb, ya, j0, NT, j0 == 0);            \
    else if (yb) SFX(dplr_bwd_group)(x, z, yb, NULL, j0, NT, j0 == 0);           \
    else SFX(dplr_bwd_group)(x, z, NULL, ya, j0, NT, j0 == 0)
    LRNN_GROUPS(x->Vp, DPLR_SWEEP);
#undef DPLR_SWEEP
}

/* One step's buffers and inputs in the backward: two of them alternate (step t's pass B
 * runs with step t - 1's pass A). */
typedef struct {
    SFX(dplr_in_t) in;
    SFX(dplr_bstep_t) y;
    SCALAR *dopad, *dvpad;
    long t, row;
} SFX(dplr_bslot_t);

/* load step t (s within the chunk) into slot m */
static void SFX(dplr_bwd_load)(const SFX(dplr_args_t) *x, SFX(dplr_bslot_t) *m,
                               const SCALAR *Sbuf, const SCALAR *U, long bb, long h,
                               long t, long s) {
    const long K = x->K, V = x->V, Vp = x->Vp, KVp = K * Vp;
    const long row = (bb * x->T + t) * x->H + h;
    SFX(dplr_load)(x, bb, t, h, &m->in);
    if (t >= DPLR_PREFETCH) {   /* the rows a few steps back: do read, the rest written */
        const long rp = row - DPLR_PREFETCH * x->H;
        SFX(lrnn_prefetch)(x->d_o + rp * V, V, 0);
        SFX(lrnn_prefetch)(x->dv + rp * V, V, 1);
        SFX(lrnn_prefetch)(x->dq + rp * K, K, 1);
        SFX(lrnn_prefetch)(x->dk + rp * K, K, 1);
        SFX(lrnn_prefetch)(x->dgk + rp * K, K, 1);
        if (!x->kda) {
            SFX(lrnn_prefetch)(x->da + rp * K, K, 1);
            SFX(lrnn_prefetch)(x->db + rp * K, K, 1);
        }
    }
    const int padded = V != Vp;   /* else do_t and dv_t are used in place */
    m->t = t;
    m->row = row;
    SFX(dplr_bstep_t) y = {
        .St = Sbuf + (s + 1) * KVp, .Sp = Sbuf + s * KVp, .U = U + s * Vp,
        .q = m->in.q, .k = m->in.k, .a = m->in.a, .b = m->in.b, .w = m->in.w, .v = m->in.v,
        .dop = SFX(lrnn_padded)(x->d_o + row * V, m->dopad, V, Vp),
        .dv = padded ? m->dvpad : x->dv + row * V,
        .du = m->y.du};
    m->y = y;
}

/* after pass A of slot m's step: dq, dk, db (KDA: dk', db into gbuf) and dv */
static void SFX(dplr_bwd_finish_a)(const SFX(dplr_args_t) *x, const SFX(dplr_bacc_t) *z,
                                   const SFX(dplr_bslot_t) *m, SCALAR *gbuf) {
    const long K = x->K, row = m->row;
    SFX(lrnn_rowsums)(x->dq + row * K, z->Pq, K, z->scale);
    SFX(lrnn_rowsums)(x->kda ? gbuf : x->dk + row * K, z->Pk, K, 1);
    SFX(lrnn_rowsums)(x->kda ? gbuf + 2 * K : x->db + row * K, z->Pb, K, 1);
    if (x->l2norm) {   /* dq (and dk without KDA: KDA's is mapped in finish_b) to the raw q */
        SFX(lrnn_l2_back)(m->in.qn, m->in.q_norm, x->dq + row * K, K);
        if (!x->kda) SFX(lrnn_l2_back)(m->in.kn, m->in.k_norm, x->dk + row * K, K);
    }
    if (x->V != x->Vp) memcpy(x->dv + row * x->V, m->dvpad, sizeof(SCALAR) * x->V);
}

/* after pass B of slot m's step: da, dgk (KDA: mapped with gbuf's dk', db to dk, dbeta,
 * dg) */
static void SFX(dplr_bwd_finish_b)(const SFX(dplr_args_t) *x, const SFX(dplr_bacc_t) *z,
                                   const SFX(dplr_bslot_t) *m, SCALAR *gbuf) {
    const long K = x->K, row = m->row;
    const SCALAR *w = m->in.w;
    SCALAR *da_t = x->kda ? gbuf + K : x->da + row * K;
    SCALAR *dgk_t = x->kda ? gbuf + 3 * K : x->dgk + row * K;
    SFX(lrnn_rowsums)(da_t, z->Pa, K, 1);
    SFX(lrnn_rowsums)(dgk_t, z->Pg, K, 1);
    #pragma omp simd
    for (long i = 0; i < K; i++) dgk_t[i] *= w[i];   /* d/dgk = w dL/dw */
    if (x->kda) {
        const SCALAR *k = m->in.kraw, beta = m->in.beta, *dk_t = gbuf, *db_t = gbuf + 2 * K;
        SCALAR *dk = x->dk + row * K, *dg = x->dgk + row * K, dbeta = 0;
        for (long i = 0; i < K; i++) {
            const SCALAR e = dk_t[i] - db_t[i], wda = w[i] * da_t[i];
            dbeta += k[i] * e;
            dk[i] = beta * e + wda;
            dg[i] = dgk_t[i] + k[i] * wda;
        }
        x->db[row] = dbeta;
        if (x->l2norm) SFX(lrnn_l2_back)(m->in.kn, m->in.k_norm, dk, K);
    }
}

static void SFX(dplr_bwd_item)(const void *args, long item) {
    SFX(dplr_args_t) *x = (SFX(dplr_args_t) *)args;
    const long bb = item / x->H, h = item % x->H, K = x->K, V = x->V, Vp = x->Vp;
    const long C = x->C, T = x->T, KVp = K * Vp, K16 = (K + 15) / 16 * 16;
    /* Sbuf (C + 1, K, Vp): S_{t0-1} .. S_{t0+C-1}; U (C, Vp): u_t; dS (K, Vp); per slot
     * (2): vpad, dopad, dvpad, du (Vp), w, kbuf (3), qn, kn (K); gbuf (4 K: KDA's dk', da,
     * db, dgk); Pq, Pk, Pb, Pa, Pg (K16, LT), rows past K zero */
    const long slot = 4 * Vp + 6 * K;
    SCALAR *buf = SFX(lrnn_buffer)((C + 1) * KVp + C * Vp + KVp + 2 * slot + 4 * K
                                   + 5 * K16 * LT);
    if (!buf) { atomic_store(&x->failed, 1); return; }
    SCALAR *Sbuf = buf, *U = Sbuf + (C + 1) * KVp, *dS = U + C * Vp, *slots = dS + KVp;
    SCALAR *gbuf = slots + 2 * slot, *Pq = gbuf + 4 * K;
    SFX(dplr_bacc_t) z = {.dS = dS, .Pq = Pq, .Pk = Pq + K16 * LT, .Pb = Pq + 2 * K16 * LT,
                          .Pa = Pq + 3 * K16 * LT, .Pg = Pq + 4 * K16 * LT, .scale = x->scale};
    SFX(dplr_bslot_t) m[2];
    for (int n = 0; n < 2; n++) {
        SCALAR *p = slots + n * slot;
        m[n].in = (SFX(dplr_in_t)){.vbuf = p, .w = p + 4 * Vp, .kbuf = p + 4 * Vp + K,
                                   .qn = p + 4 * Vp + 4 * K, .kn = p + 4 * Vp + 5 * K};
        m[n].dopad = p + Vp;
        m[n].dvpad = p + 2 * Vp;
        m[n].y.du = p + 3 * Vp;
    }
    if (x->dS_last) SFX(lrnn_pad)(dS, x->dS_last + item * K * V, K, V, Vp);
    SFX(dplr_in_t) rin = m[0].in;     /* the recompute's inputs */
    for (long c = x->n_chunks - 1; c >= 0; c--) {
        const long t0 = c * C,
                   steps = SFX(lrnn_ckpt_restore)(Sbuf, x->ckpt, item, x->n_chunks, C, T, c, KVp);
        for (long s = 0; s < steps; s++) {
            SFX(dplr_load)(x, bb, t0 + s, h, &rin);
            SFX(dplr_step)(x, Sbuf + (s + 1) * KVp, Sbuf + s * KVp, &rin, U + s * Vp, NULL);
        }
        /* pass A of the chunk's last step alone, then B of step s with A of step s - 1,
         * then B of the first step alone (the chunk before is not recomputed yet) */
        int cur = 0;
        SFX(dplr_bwd_load)(x, &m[cur], Sbuf, U, bb, h, t0 + steps - 1, steps - 1);
        SFX(dplr_bwd_sweep)(x, &z, NULL, &m[cur].y);
        SFX(dplr_bwd_finish_a)(x, &z, &m[cur], gbuf);
        for (long s = steps - 1; s >= 1; s--) {
            SFX(dplr_bwd_load)(x, &m[!cur], Sbuf, U, bb, h, t0 + s - 1, s - 1);
            SFX(dplr_bwd_sweep)(x, &z, &m[cur].y, &m[!cur].y);
            SFX(dplr_bwd_finish_b)(x, &z, &m[cur], gbuf);
            SFX(dplr_bwd_finish_a)(x, &z, &m[!cur], gbuf);
            cur = !cur;
        }
        SFX(dplr_bwd_sweep)(x, &z, &m[cur].y, NULL);
        SFX(dplr_bwd_finish_b)(x, &z, &m[cur], gbuf);
    }
    SFX(lrnn_unpad)(x->dh0 + item * K * V, dS, K, V, Vp);
    free(buf);
}

int SFX(dplr_fwd)(void *const *p, const long *s) {
    SFX(dplr_args_t) x;
    SFX(dplr_unpack)(&x, p, s, 0);
    return run_items(SFX(dplr_fwd_item), &x, &x.failed, x.B * x.H, s[6]);
}

int SFX(dplr_bwd)(void *const *p, const long *s) {
    SFX(dplr_args_t) x;
    SFX(dplr_unpack)(&x, p, s, 1);
    return run_items(SFX(dplr_bwd_item), &x, &x.failed, x.B * x.H, s[6]);
}

#undef DAT
#undef LT
#undef DPLR_PREFETCH
#undef VEC
