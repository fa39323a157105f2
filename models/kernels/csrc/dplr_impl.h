/*
 * Body of the generalised (diagonal-plus-low-rank) delta-rule kernel: RWKV-7 and Kimi
 * Delta Attention (models/kernels/generalized_delta.py, the torch side in
 * models/kernels/generalized_delta_cpu.py). Included by cpu_kernels.c once per scalar type
 * with SCALAR, EXP and SFX(name) defined, AFTER linear_rnn_impl.h: it reuses that file's
 * tile type and helpers (SFX(vec_t), ld / st, lrnn_rowsums, lrnn_buffer, lrnn_pad /
 * lrnn_unpad, lrnn_prefetch).
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
 * column sums dv, du), pass B (needs all of du: the row sums da, dw and the new dS).
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
 *      (b, t, h), 10-12 k, 13-15 v, 16-18 a, 19-21 b, 22-24 gk, 25 kda (0/1)
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
    long B, T, H, K, V, Vp, C, n_chunks, kda;
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
    const SCALAR *kraw;                /* KDA: k_t as given */
    SCALAR beta;                       /* KDA: beta_t */
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
    if (x->V == x->Vp) {
        in->v = DAT(x, x->v, 2, bb, t, h);
    } else {   /* copied into a padded row (the pad stays zero) */
        memcpy(in->vbuf, DAT(x, x->v, 2, bb, t, h), sizeof(SCALAR) * x->V);
        in->v = in->vbuf;
    }
    const SCALAR *g_t = DAT(x, x->gk, 5, bb, t, h);
    #pragma omp simd
    for (long i = 0; i < x->K; i++) in->w[i] = EXP(g_t[i]);
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
    for (long j0 = 0; j0 < x->Vp; j0 += 4 * LT) {
        switch ((x->Vp - j0) / LT) {
        case 1: SFX(dplr_step_group)(x, dst, src, in, upad, opad, j0, 1); break;
        case 2: SFX(dplr_step_group)(x, dst, src, in, upad, opad, j0, 2); break;
        case 3: SFX(dplr_step_group)(x, dst, src, in, upad, opad, j0, 3); break;
        default: SFX(dplr_step_group)(x, dst, src, in, upad, opad, j0, 4); break;
        }
    }
}

static void SFX(dplr_fwd_item)(const void *args, long item) {
    SFX(dplr_args_t) *x = (SFX(dplr_args_t) *)args;
    const long bb = item / x->H, h = item % x->H, K = x->K, V = x->V, Vp = x->Vp;
    const long KVp = K * Vp;
    SCALAR *buf = SFX(lrnn_buffer)(KVp + 2 * Vp + 4 * K);
    if (!buf) { atomic_store(&x->failed, 1); return; }
    SCALAR *S = buf, *vpad = S + KVp, *opad = vpad + Vp, *w = opad + Vp;
    SFX(dplr_in_t) in = {.vbuf = vpad, .w = w, .kbuf = w + K};
    const int padded = V != Vp;   /* else o_t is written in place */
    if (x->h0) SFX(lrnn_pad)(S, x->h0 + item * K * V, K, V, Vp);
    for (long t = 0; t < x->T; t++) {
        if (x->ckpt && t % x->C == 0)
            memcpy(x->ckpt + (item * x->n_chunks + t / x->C) * KVp, S, sizeof(SCALAR) * KVp);
        SFX(dplr_load)(x, bb, t, h, &in);
        SCALAR *o_t = x->o + ((bb * x->T + t) * x->H + h) * V;
        SFX(dplr_step)(x, S, S, &in, NULL, padded ? opad : o_t);
        if (padded) memcpy(o_t, opad, sizeof(SCALAR) * V);
    }
    SFX(lrnn_unpad)(x->S_last + item * K * V, S, K, V, Vp);
    free(buf);
}

/* What one backward step reads and writes (pointers into the item's buffers). */
typedef struct {
    const SCALAR *St, *Sp, *U;          /* S_t, S_{t-1} (K, Vp), u_t (Vp) */
    const SCALAR *q, *k, *a, *b, *w, *v, *dop;
    SCALAR scale;
    SCALAR *dS, *dv;                    /* dS (K, Vp); dv (Vp) */
    SCALAR *Pq, *Pk, *Pb, *Pa, *Pg;     /* per-lane parts of the row sums (K16, LT) */
} SFX(dplr_bstep_t);

static inline void SFX(dplr_part)(SCALAR *p, VEC x, const int first) {
    SFX(st)(p, first ? x : SFX(ld)(p) + x);
}

/* The backward of one step over the nt tiles from column j0 (module comment: passes A
 * and B). nt is a constant at every call, so the tile loops unroll. */
static inline __attribute__((always_inline)) void
SFX(dplr_bwd_group)(const SFX(dplr_args_t) *x, SFX(dplr_bstep_t) *y, long j0, const int nt,
                    const int first) {
    const long K = x->K, Vp = x->Vp;
    VEC dov[4], vv[4], uu[4], dvs[4], dus[4];
    for (int j = 0; j < nt; j++) {
        dov[j] = SFX(ld)(y->dop + j0 + j * LT);
        vv[j] = SFX(ld)(y->v + j0 + j * LT);
        uu[j] = SFX(ld)(y->U + j0 + j * LT);
        dvs[j] = (VEC){0};
        dus[j] = (VEC){0};
    }
    /* pass A: dS += scale q do^T; dq = S_t do; dk = dS v; db = dS u; dv = dS^T k;
     * du = dS^T b */
    for (long i = 0; i < K; i++) {
        SCALAR *dSi = y->dS + i * Vp + j0;
        const SCALAR *Sti = y->St + i * Vp + j0;
        const SCALAR sq = y->scale * y->q[i], ki = y->k[i], bi = y->b[i];
        VEC aq = {0}, ak = {0}, ab = {0};
        for (int j = 0; j < nt; j++) {
            const VEC d = SFX(ld)(dSi + j * LT) + sq * dov[j];
            aq += SFX(ld)(Sti + j * LT) * dov[j];
            ak += d * vv[j];
            ab += d * uu[j];
            dvs[j] += ki * d;
            dus[j] += bi * d;
            SFX(st)(dSi + j * LT, d);
        }
        SFX(dplr_part)(y->Pq + i * LT, aq, first);
        SFX(dplr_part)(y->Pk + i * LT, ak, first);
        SFX(dplr_part)(y->Pb + i * LT, ab, first);
    }
    for (int j = 0; j < nt; j++) SFX(st)(y->dv + j0 + j * LT, dvs[j]);
    /* pass B: da = S_{t-1} du; dw = sum_j dS S_{t-1}; dS <- diag(w) dS + a du^T */
    for (long i = 0; i < K; i++) {
        SCALAR *dSi = y->dS + i * Vp + j0;
        const SCALAR *Spi = y->Sp + i * Vp + j0;
        const SCALAR wi = y->w[i], ai = y->a[i];
        VEC aa = {0}, ag = {0};
        for (int j = 0; j < nt; j++) {
            const VEC sp = SFX(ld)(Spi + j * LT), d = SFX(ld)(dSi + j * LT);
            aa += sp * dus[j];
            ag += d * sp;
            SFX(st)(dSi + j * LT, wi * d + ai * dus[j]);
        }
        SFX(dplr_part)(y->Pa + i * LT, aa, first);
        SFX(dplr_part)(y->Pg + i * LT, ag, first);
    }
}

static void SFX(dplr_bwd_item)(const void *args, long item) {
    SFX(dplr_args_t) *x = (SFX(dplr_args_t) *)args;
    const long bb = item / x->H, h = item % x->H, K = x->K, V = x->V, Vp = x->Vp;
    const long C = x->C, H = x->H, T = x->T, KVp = K * Vp, K16 = (K + 15) / 16 * 16;
    /* Sbuf (C + 1, K, Vp): S_{t0-1} .. S_{t0+C-1}; U (C, Vp): u_t; dS (K, Vp);
     * vpad, dopad, dvpad (Vp); w, kbuf (3), gk (4: KDA's dk', da, db, dgk) (K each);
     * Pq, Pk, Pb, Pa, Pg (K16, LT), rows past K zero */
    SCALAR *buf = SFX(lrnn_buffer)((C + 1) * KVp + C * Vp + KVp + 3 * Vp + 8 * K
                                   + 5 * K16 * LT);
    if (!buf) { atomic_store(&x->failed, 1); return; }
    SCALAR *Sbuf = buf, *U = Sbuf + (C + 1) * KVp, *dS = U + C * Vp, *vpad = dS + KVp;
    SCALAR *dopad = vpad + Vp, *dvpad = dopad + Vp, *w = dvpad + Vp, *kbuf = w + K;
    SCALAR *gbuf = kbuf + 3 * K, *Pq = gbuf + 4 * K;
    SCALAR *Pk = Pq + K16 * LT, *Pb = Pk + K16 * LT, *Pa = Pb + K16 * LT;
    SCALAR *Pg = Pa + K16 * LT;
    SFX(dplr_in_t) in = {.vbuf = vpad, .w = w, .kbuf = kbuf};
    const int padded = V != Vp;   /* else do_t and dv_t are used in place */
    if (x->dS_last) SFX(lrnn_pad)(dS, x->dS_last + item * K * V, K, V, Vp);
    for (long c = x->n_chunks - 1; c >= 0; c--) {
        const long t0 = c * C, steps = (T - t0) < C ? (T - t0) : C;
        memcpy(Sbuf, x->ckpt + (item * x->n_chunks + c) * KVp, sizeof(SCALAR) * KVp);
        for (long s = 0; s < steps; s++) {
            SFX(dplr_load)(x, bb, t0 + s, h, &in);
            SFX(dplr_step)(x, Sbuf + (s + 1) * KVp, Sbuf + s * KVp, &in, U + s * Vp, NULL);
        }
        for (long s = steps - 1; s >= 0; s--) {
            const long t = t0 + s, row = (bb * T + t) * H + h;
            SFX(dplr_load)(x, bb, t, h, &in);
            if (t >= DPLR_PREFETCH) {   /* the rows a few steps back: do read, the rest written */
                const long rp = row - DPLR_PREFETCH * H;
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
            const SCALAR *do_t = x->d_o + row * V;
            SCALAR *dv_t = x->dv + row * V;
            if (padded) memcpy(dopad, do_t, sizeof(SCALAR) * V);
            SFX(dplr_bstep_t) y = {
                .St = Sbuf + (s + 1) * KVp, .Sp = Sbuf + s * KVp, .U = U + s * Vp,
                .q = in.q, .k = in.k, .a = in.a, .b = in.b, .w = w, .v = in.v,
                .dop = padded ? dopad : do_t, .scale = x->scale, .dS = dS,
                .dv = padded ? dvpad : dv_t, .Pq = Pq, .Pk = Pk, .Pb = Pb, .Pa = Pa, .Pg = Pg};
            for (long j0 = 0; j0 < Vp; j0 += 4 * LT) {
                const int first = j0 == 0;
                switch ((Vp - j0) / LT) {
                case 1: SFX(dplr_bwd_group)(x, &y, j0, 1, first); break;
                case 2: SFX(dplr_bwd_group)(x, &y, j0, 2, first); break;
                case 3: SFX(dplr_bwd_group)(x, &y, j0, 3, first); break;
                default: SFX(dplr_bwd_group)(x, &y, j0, 4, first); break;
                }
            }
            /* KDA: dk', da, db, dgk into gbuf, then mapped to dk, dbeta, dg below */
            SCALAR *dk_t = x->kda ? gbuf : x->dk + row * K;
            SCALAR *da_t = x->kda ? gbuf + K : x->da + row * K;
            SCALAR *db_t = x->kda ? gbuf + 2 * K : x->db + row * K;
            SCALAR *dgk_t = x->kda ? gbuf + 3 * K : x->dgk + row * K;
            SFX(lrnn_rowsums)(x->dq + row * K, Pq, K, x->scale);
            SFX(lrnn_rowsums)(dk_t, Pk, K, 1);
            SFX(lrnn_rowsums)(db_t, Pb, K, 1);
            SFX(lrnn_rowsums)(da_t, Pa, K, 1);
            SFX(lrnn_rowsums)(dgk_t, Pg, K, 1);
            #pragma omp simd
            for (long i = 0; i < K; i++) dgk_t[i] *= w[i];   /* d/dgk = w dL/dw */
            if (x->kda) {
                const SCALAR *k = in.kraw, beta = in.beta;
                SCALAR *dk = x->dk + row * K, *dg = x->dgk + row * K, dbeta = 0;
                for (long i = 0; i < K; i++) {
                    const SCALAR e = dk_t[i] - db_t[i], wkda = w[i] * da_t[i];
                    dbeta += k[i] * e;
                    dk[i] = beta * e + wkda;
                    dg[i] = dgk_t[i] + k[i] * wkda;
                }
                x->db[row] = dbeta;
            }
            if (padded) memcpy(dv_t, dvpad, sizeof(SCALAR) * V);
        }
    }
    SFX(lrnn_unpad)(x->dh0 + item * K * V, dS, K, V, Vp);
    free(buf);
}

int SFX(dplr_fwd)(void *const *p, const long *s) {
    SFX(dplr_args_t) x;
    SFX(dplr_unpack)(&x, p, s, 0);
    run_parallel(SFX(dplr_fwd_item), &x, x.B * x.H, (int)s[6]);
    return atomic_load(&x.failed) ? -1 : 0;
}

int SFX(dplr_bwd)(void *const *p, const long *s) {
    SFX(dplr_args_t) x;
    SFX(dplr_unpack)(&x, p, s, 1);
    run_parallel(SFX(dplr_bwd_item), &x, x.B * x.H, (int)s[6]);
    return atomic_load(&x.failed) ? -1 : 0;
}

#undef DAT
#undef LT
#undef DPLR_PREFETCH
#undef VEC
