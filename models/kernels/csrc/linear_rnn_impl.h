/*
 * Body of the linear-RNN kernels (models/kernels/linear_rnn.py's five operators), included
 * by cpu_kernels.c once per scalar type with SCALAR, EXP and SFX(name) defined.
 *
 * One recurrence over a (K, V) state per batch row b and head h, t = 0..T-1:
 *
 *   S'  = a_t . S_{t-1}            a_t = exp(g_t): 1 (no gate), one number (scalar gate)
 *                                  or one per key row i (vector gate, gla)
 *   w_t = v_t                      (plain)
 *   w_t = beta_t (v_t - S'^T k_t)  (delta rule; r_t = v_t - S'^T k_t)
 *   S_t = S' + k_t w_t^T
 *   o_t = scale S_t^T q_t
 *
 * Why it exists: on a CPU the chunked PyTorch form is bound by small (chunk, chunk) and
 * (chunk, K) matmuls, which torch runs at a fifth of its large-GEMM speed, and it does
 * twice the arithmetic of the recurrence. Here the state stays in L1 (32 x 32 floats is
 * 4 KiB), the loops run over tiles of state rows (below), and the (batch, head) items
 * run in parallel. Measured (docs/results/operators.md, "Linear-RNN operators: the C recurrence"): fwd + bwd
 * 21-31x faster than the `*_ref` oracles and 1.8-5.3x faster than the chunked form on a
 * 2-core CPU at L = 4096, with a third of the chunked form's memory. Per step the
 * backward does four FMAs per state element (the forward two); one thread runs within
 * ~2x of the FMA units' rate when its inputs are in cache, and ~30% slower when they
 * stream from memory (hence the prefetches below).
 *
 * Backward, by hand. With dS = dL/dS_t gathered from the future, per step, last first:
 *   dS    += scale q_t do_t^T;   dq_t = scale S_t do_t;   dk_t = dS w_t;   dw = dS^T k_t
 *   plain: dv_t = dw.   delta: dv_t = beta dw, dbeta_t = dw . r_t, du = -beta dw,
 *                       dk_t += S' du, dS += k_t du^T            (dS is now dL/dS')
 *   gated: dg_i = sum_j dS_ij S'_ij (summed over i for a scalar gate);  dS = a_t . dS
 *          (without the delta rule dg comes from dq and dk instead: see gacc below; a
 *          float32 dg of GLA at L = 4096 is then within 5e-6 of float64, relative norm)
 * The states S_{t-1}, S_t come from the forward's checkpoints: the state before every
 * chunk of C steps is stored, and the backward recomputes one chunk at a time into a
 * (C + 1, K, V) buffer (memory O(T / C) states, not O(T)).
 *
 * Tiles: a state row is held as Vp = ceil(V / LT) * LT numbers (zero past V), and every
 * inner loop runs over tiles of LT = 16 columns with its sums in registers: columns of the
 * state never mix (only rows do). The forward goes tile by tile. The backward goes row by
 * row over groups of up to 4 tiles, so dL/dw stays in registers across the rows and each
 * row sum (dq, dk, the vector gate's dg) leaves one tile per row; 16 rows' tiles are then
 * summed at once by a transpose-and-add tree (lrnn_rowsums16; a lane-by-lane sum per row
 * cost more than the rest of a step).
 *
 * Layout: q, k, v, g, beta are read through (batch, time, head) strides with a contiguous
 * last axis, so broadcast views (Mamba-2's B and C shared by the heads: head stride 0) and
 * slices of a projection are read in place. Outputs are contiguous:
 *   o, do: (B, T, H, V); dq, dk: (B, T, H, K); dv: (B, T, H, V); dg: like g; dbeta (B, T, H)
 *   h0, S_last, dS_last, dh0: (B, H, K, V); ckpt: (B, H, n_chunks, K, Vp) (padded rows)
 *
 * Entry points (arrays, as the scan's):
 *   p: 0 q, 1 k, 2 v, 3 g|NULL, 4 beta|NULL, 5 h0|NULL, 6 scale (one SCALAR), 7 o,
 *      8 S_last, 9 ckpt|NULL (forward: NULL = no backward will follow);
 *      backward adds 10 do, 11 dS_last|NULL, 12 dq, 13 dk, 14 dv, 15 dg|NULL,
 *      16 dbeta|NULL, 17 dh0
 *   s: 0 B, 1 T, 2 H, 3 K, 4 V, 5 gate (0 none, 1 scalar, 2 vector), 6 delta (0/1; not
 *      with a vector gate: no operator has both, and the backward does not handle it),
 *      7 C (steps per chunk), 8 threads, 9-11 q strides (b, t, h), 12-14 k, 15-17 v,
 *      18-20 g, 21-23 beta, 24 l2norm (0/1: q and k divided by max(|x|, 1e-12) per step
 *      inside the kernel, as fla's use_qk_l2norm_in_kernel; the backward maps dq, dk back
 *      through it, so autograd keeps the raw q, k and no normalised copies)
 * Returns 0, or -1 when a work buffer cannot be allocated.
 */

#ifndef LRNN_LT
#define LRNN_LT 16     /* lanes per tile; linear_rnn_cpu.py pads the checkpoints to match */

/* Runs `call` for each group of up to 4 tiles of a padded row of Vp columns: j0 the group's
 * first column, NT its tile count, a constant in each branch so that the tile loops of the
 * always-inline group bodies unroll (the forward steps and backward sweeps here and in
 * dplr_impl.h). */
#define LRNN_GROUPS(Vp, call)                                                             \
    for (long j0 = 0; j0 < (Vp); j0 += 4 * LRNN_LT) {                                     \
        switch (((Vp) - j0) / LRNN_LT) {                                                  \
        case 1: { const int NT = 1; call; } break;                                        \
        case 2: { const int NT = 2; call; } break;                                        \
        case 3: { const int NT = 3; call; } break;                                        \
        default: { const int NT = 4; call; } break;                                       \
        }                                                                                 \
    }
#endif
#define LT LRNN_LT
#define LRNN_PREFETCH 8

typedef struct {
    const SCALAR *q, *k, *v, *g, *beta, *h0;
    SCALAR scale;
    SCALAR *o, *S_last, *ckpt;
    const SCALAR *d_o, *dS_last;
    SCALAR *dq, *dk, *dv, *dg, *dbeta, *dh0;
    long B, T, H, K, V, Vp, gate, delta, C, n_chunks, l2norm;
    long sq[3], sk[3], sv[3], sg[3], sb[3];
    atomic_int failed;
} SFX(lrnn_args_t);

static void SFX(lrnn_unpack)(SFX(lrnn_args_t) *a, void *const *p, const long *s, int backward) {
    a->q = p[0]; a->k = p[1]; a->v = p[2]; a->g = p[3]; a->beta = p[4]; a->h0 = p[5];
    a->scale = *(const SCALAR *)p[6];
    a->o = p[7]; a->S_last = p[8]; a->ckpt = p[9];
    a->d_o = backward ? p[10] : NULL; a->dS_last = backward ? p[11] : NULL;
    a->dq = backward ? p[12] : NULL; a->dk = backward ? p[13] : NULL;
    a->dv = backward ? p[14] : NULL; a->dg = backward ? p[15] : NULL;
    a->dbeta = backward ? p[16] : NULL; a->dh0 = backward ? p[17] : NULL;
    a->B = s[0]; a->T = s[1]; a->H = s[2]; a->K = s[3]; a->V = s[4];
    a->Vp = (a->V + LT - 1) / LT * LT;
    a->gate = s[5]; a->delta = s[6]; a->C = s[7]; a->l2norm = s[24];
    for (int i = 0; i < 3; i++) {
        a->sq[i] = s[9 + i]; a->sk[i] = s[12 + i]; a->sv[i] = s[15 + i];
        a->sg[i] = s[18 + i]; a->sb[i] = s[21 + i];
    }
    a->n_chunks = (a->T + a->C - 1) / a->C;
    atomic_init(&a->failed, 0);
}

/* element (b, t, h) of a strided input */
#define AT(ptr, st, b, t, h) ((ptr) + (b) * (st)[0] + (t) * (st)[1] + (h) * (st)[2])

/* One tile as a vector value (GCC / Clang vector extension: the compiler keeps it in
 * registers, which a local array with an omp simd loop was not: its sums went through the
 * stack, a store-to-load chain per state row). Loads and stores by memcpy: any alignment. */
typedef SCALAR SFX(vec_t) __attribute__((vector_size(LT * sizeof(SCALAR))));
#define VEC SFX(vec_t)

static inline VEC SFX(ld)(const SCALAR *p) { VEC x; memcpy(&x, p, sizeof x); return x; }
static inline void SFX(st)(SCALAR *p, VEC x) { memcpy(p, &x, sizeof x); }

/* the sum of a tile's LT = 16 lanes, pairwise */
static inline SCALAR SFX(lrnn_hsum)(VEC x) {
    SCALAR l[LT], a8[8], a4[4];
    memcpy(l, &x, sizeof l);
    for (int i = 0; i < 8; i++) a8[i] = l[i] + l[i + 8];
    for (int i = 0; i < 4; i++) a4[i] = a8[i] + a8[i + 4];
    return (a4[0] + a4[2]) + (a4[1] + a4[3]);
}

/* p += x: a row sum's per-lane part, added up over the groups of tiles (first: the step's
 * first group, which starts the sum) */
static inline void SFX(lrnn_part)(SCALAR *p, VEC x, const int first) {
    SFX(st)(p, first ? x : SFX(ld)(p) + x);
}

/* What step t reads besides the state: q_t, k_t (pointers), v_t padded to Vp, the decays
 * (one per key row; NULL without a gate) and beta. */
typedef struct {
    const SCALAR *q, *k, *v;    /* v: in place when V fills whole tiles, else vbuf */
    SCALAR *vbuf, *dec;
    SCALAR beta;
    SCALAR *qn, *kn;            /* l2norm: the normalised q_t, k_t (K each) */
    SCALAR q_norm, k_norm;      /* and max(|q_t|, eps), max(|k_t|, eps) */
} SFX(lrnn_in_t);

/* y = x / max(|x|, eps) (F.normalize's eps); returns max(|x|, eps) */
static SCALAR SFX(lrnn_l2)(const SCALAR *x, SCALAR *y, long K) {
    SCALAR ss = 0;
    for (long i = 0; i < K; i++) ss += x[i] * x[i];
    SCALAR n = sqrt(ss);
    n = n > (SCALAR)1e-12 ? n : (SCALAR)1e-12;
    for (long i = 0; i < K; i++) y[i] = x[i] / n;
    return n;
}

/* dL/dx from dL/dy for y = x / max(|x|, eps), in place: (dy - y (y . dy)) / |x|, or dy / eps
 * where the norm is below eps (there the map is a plain scaling) */
static void SFX(lrnn_l2_back)(const SCALAR *y, SCALAR n, SCALAR *d, long K) {
    SCALAR yd = 0;
    if (n > (SCALAR)1e-12)
        for (long i = 0; i < K; i++) yd += y[i] * d[i];
    for (long i = 0; i < K; i++) d[i] = (d[i] - y[i] * yd) / n;
}

/* a row of V numbers as a padded row of Vp: in place when V fills whole tiles (V == Vp),
 * else copied into pad (whose tail past V stays zero) */
static inline const SCALAR *SFX(lrnn_padded)(const SCALAR *row, SCALAR *pad, long V,
                                              long Vp) {
    if (V == Vp) return row;
    memcpy(pad, row, sizeof(SCALAR) * V);
    return pad;
}

/* ask for the cache lines of n numbers from p, to read (write 0) or to write (1) */
static inline void SFX(lrnn_prefetch)(const SCALAR *p, long n, const int write) {
    for (long i = 0; i < n; i += 64 / (long)sizeof(SCALAR)) {
        if (write) __builtin_prefetch(p + i, 1);
        else __builtin_prefetch(p + i, 0);
    }
}

static void SFX(lrnn_load)(const SFX(lrnn_args_t) *a, long b, long t, long h,
                           SFX(lrnn_in_t) *in) {
    /* the rows a few steps ahead: each item reads its rows a (time) stride apart, which the
     * hardware prefetcher followed poorly (the first load of v_t took a third of the
     * forward's time) */
    if (t + LRNN_PREFETCH < a->T) {
        const long tp = t + LRNN_PREFETCH;
        SFX(lrnn_prefetch)(AT(a->q, a->sq, b, tp, h), a->K, 0);
        SFX(lrnn_prefetch)(AT(a->k, a->sk, b, tp, h), a->K, 0);
        SFX(lrnn_prefetch)(AT(a->v, a->sv, b, tp, h), a->V, 0);
        if (a->gate) SFX(lrnn_prefetch)(AT(a->g, a->sg, b, tp, h), a->gate == 2 ? a->K : 1, 0);
    }
    in->q = AT(a->q, a->sq, b, t, h);
    in->k = AT(a->k, a->sk, b, t, h);
    in->v = SFX(lrnn_padded)(AT(a->v, a->sv, b, t, h), in->vbuf, a->V, a->Vp);
    if (a->gate) {
        const SCALAR *g_t = AT(a->g, a->sg, b, t, h);
        if (a->gate == 2) {
            #pragma omp simd
            for (long i = 0; i < a->K; i++) in->dec[i] = EXP(g_t[i]);
        } else {
            const SCALAR d = EXP(g_t[0]);
            for (long i = 0; i < a->K; i++) in->dec[i] = d;
        }
    }
    in->beta = a->delta ? *AT(a->beta, a->sb, b, t, h) : 0;
    if (a->l2norm) {
        in->q_norm = SFX(lrnn_l2)(in->q, in->qn, a->K);
        in->k_norm = SFX(lrnn_l2)(in->k, in->kn, a->K);
        in->q = in->qn;
        in->k = in->kn;
    }
}

/* One step from state src to state dst (K, Vp; the same pointer for a step in place):
 * decay, delta correction, update; then, if opad, opad = scale S_t^T q_t (Vp).
 * r (Vp): v - S'^T k, kept for the backward (delta). The decay is applied as the row is
 * read, so a gated step reads and writes every state row once (twice read for the delta
 * rules: once for S'^T k, once for the update). Rows go in the inner loop over groups of
 * up to 4 tiles (as in the backward), with v_t's tiles and the output sums in registers:
 * the step's inputs are read before its stores (read after them, the load of v_t took a
 * third of the forward's time). nt is a constant at every call. */
static inline __attribute__((always_inline)) void
SFX(lrnn_step_group)(const SFX(lrnn_args_t) *a, SCALAR *dst, const SCALAR *src,
                     const SFX(lrnn_in_t) *in, SCALAR *restrict r, SCALAR *restrict opad,
                     long j0, const int nt) {
    const long K = a->K, Vp = a->Vp;
    const SCALAR *restrict k_t = in->k, *restrict q_t = in->q, *restrict dec = in->dec;
    const int gated = a->gate != 0;
    VEC w[4], o0[4], o1[4];    /* two output sums per tile: half the dependency chain */
    for (int j = 0; j < nt; j++) {
        w[j] = SFX(ld)(in->v + j0 + j * LT);
        o0[j] = (VEC){0};
        o1[j] = (VEC){0};
    }
    if (a->delta) {
        VEC u0[4], u1[4];
        for (int j = 0; j < nt; j++) { u0[j] = (VEC){0}; u1[j] = (VEC){0}; }
        long i = 0;
        for (; i + 1 < K; i += 2) {
            const SCALAR c0 = gated ? k_t[i] * dec[i] : k_t[i];
            const SCALAR c1 = gated ? k_t[i + 1] * dec[i + 1] : k_t[i + 1];
            const SCALAR *s0 = src + i * Vp + j0, *s1 = s0 + Vp;
            for (int j = 0; j < nt; j++) {
                u0[j] += c0 * SFX(ld)(s0 + j * LT);
                u1[j] += c1 * SFX(ld)(s1 + j * LT);
            }
        }
        if (i < K) {
            const SCALAR c0 = gated ? k_t[i] * dec[i] : k_t[i];
            for (int j = 0; j < nt; j++) u0[j] += c0 * SFX(ld)(src + i * Vp + j0 + j * LT);
        }
        for (int j = 0; j < nt; j++) {
            const VEC rr = w[j] - (u0[j] + u1[j]);
            SFX(st)(r + j0 + j * LT, rr);
            w[j] = in->beta * rr;
        }
    }
    long i = 0;
    for (; i + 1 < K; i += 2) {
        const SCALAR *s0 = src + i * Vp + j0, *s1 = s0 + Vp;
        SCALAR *d0 = dst + i * Vp + j0, *d1 = d0 + Vp;
        for (int j = 0; j < nt; j++) {
            const VEC y0 = SFX(ld)(s0 + j * LT), y1 = SFX(ld)(s1 + j * LT);
            const VEC x0 = (gated ? y0 * dec[i] : y0) + k_t[i] * w[j];
            const VEC x1 = (gated ? y1 * dec[i + 1] : y1) + k_t[i + 1] * w[j];
            SFX(st)(d0 + j * LT, x0);
            SFX(st)(d1 + j * LT, x1);
            o0[j] += q_t[i] * x0;
            o1[j] += q_t[i + 1] * x1;
        }
    }
    if (i < K) {
        const SCALAR *s0 = src + i * Vp + j0;
        for (int j = 0; j < nt; j++) {
            const VEC y0 = SFX(ld)(s0 + j * LT);
            const VEC x0 = (gated ? y0 * dec[i] : y0) + k_t[i] * w[j];
            SFX(st)(dst + i * Vp + j0 + j * LT, x0);
            o0[j] += q_t[i] * x0;
        }
    }
    if (opad)
        for (int j = 0; j < nt; j++) SFX(st)(opad + j0 + j * LT, a->scale * (o0[j] + o1[j]));
}

static void SFX(lrnn_step)(const SFX(lrnn_args_t) *a, SCALAR *dst, const SCALAR *src,
                           const SFX(lrnn_in_t) *in, SCALAR *restrict r,
                           SCALAR *restrict opad) {
    LRNN_GROUPS(a->Vp, SFX(lrnn_step_group)(a, dst, src, in, r, opad, j0, NT));
}

/* one aligned work buffer of n numbers, zeroed (so every pad starts at zero) */
static SCALAR *SFX(lrnn_buffer)(long n) {
    const size_t bytes = sizeof(SCALAR) * (size_t)((n + 15) / 16 * 16);
    SCALAR *buf = aligned_alloc(64, bytes);
    if (buf) memset(buf, 0, bytes);
    return buf;
}

/* copy a (K, V) state in/out of the padded (K, Vp) layout */
static void SFX(lrnn_pad)(SCALAR *restrict dst, const SCALAR *restrict src, long K, long V,
                          long Vp) {
    for (long i = 0; i < K; i++) memcpy(dst + i * Vp, src + i * V, sizeof(SCALAR) * V);
}

static void SFX(lrnn_unpad)(SCALAR *restrict dst, const SCALAR *restrict src, long K, long V,
                            long Vp) {
    for (long i = 0; i < K; i++) memcpy(dst + i * V, src + i * Vp, sizeof(SCALAR) * V);
}

/* The checkpoints ckpt (items, n_chunks, K, Vp) hold each item's state before steps 0, C,
 * 2C, ... Forward, before step t: S (K, Vp) stored when t starts a chunk (no ckpt: no
 * backward follows). */
static inline void SFX(lrnn_ckpt_store)(SCALAR *ckpt, const SCALAR *S, long item,
                                        long n_chunks, long C, long t, long KVp) {
    if (ckpt && t % C == 0)
        memcpy(ckpt + (item * n_chunks + t / C) * KVp, S, sizeof(SCALAR) * KVp);
}

/* Backward: chunk c's stored state copied into S; returns the chunk's step count, C or, for
 * the last chunk, what is left of the T steps. */
static inline long SFX(lrnn_ckpt_restore)(SCALAR *S, const SCALAR *ckpt, long item,
                                          long n_chunks, long C, long T, long c, long KVp) {
    memcpy(S, ckpt + (item * n_chunks + c) * KVp, sizeof(SCALAR) * KVp);
    return (T - c * C) < C ? (T - c * C) : C;
}

static void SFX(lrnn_fwd_item)(const void *args, long item) {
    SFX(lrnn_args_t) *a = (SFX(lrnn_args_t) *)args;
    const long b = item / a->H, h = item % a->H, K = a->K, V = a->V, Vp = a->Vp;
    const long KVp = K * Vp;
    SCALAR *buf = SFX(lrnn_buffer)(KVp + 3 * Vp + 3 * K);
    if (!buf) { atomic_store(&a->failed, 1); return; }
    SCALAR *S = buf, *vpad = S + KVp, *opad = vpad + Vp, *r = opad + Vp, *dec = r + Vp;
    SFX(lrnn_in_t) in = {.vbuf = vpad, .dec = dec, .qn = dec + K, .kn = dec + 2 * K};
    const int padded = V != Vp;   /* else o_t is written in place (no copy per step) */
    if (a->h0) SFX(lrnn_pad)(S, a->h0 + item * K * V, K, V, Vp);
    for (long t = 0; t < a->T; t++) {
        SFX(lrnn_ckpt_store)(a->ckpt, S, item, a->n_chunks, a->C, t, KVp);
        SFX(lrnn_load)(a, b, t, h, &in);
        SCALAR *o_t = a->o + ((b * a->T + t) * a->H + h) * V;
        if (t + LRNN_PREFETCH < a->T) SFX(lrnn_prefetch)(o_t + LRNN_PREFETCH * a->H * V, V, 1);
        SFX(lrnn_step)(a, S, S, &in, r, padded ? opad : o_t);
        if (padded) memcpy(o_t, opad, sizeof(SCALAR) * V);
    }
    SFX(lrnn_unpad)(a->S_last + item * K * V, S, K, V, Vp);
    free(buf);
}

/* Row sums of 16 tiles at once: out[i] = the sum of the LT lanes of P[i], i < 16, as a
 * transpose-and-add tree (each level halves the lanes per row and doubles the rows per
 * vector: 15 vector adds and 30 shuffles for 16 rows, where 16 separate lane sums take
 * 240 scalar adds). P holds 16 tiles (rows past the caller's count are zero). */
#if LT == 16 && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12))
#define LRNN_SHUF(x, y, ...) __builtin_shufflevector(x, y, __VA_ARGS__)
static inline VEC SFX(lrnn_rowsums16)(const SCALAR *P) {
    VEC l1[8], l2[4], l3[2];
    for (int m = 0; m < 8; m++) {
        const VEC x = SFX(ld)(P + (2 * m) * LT), y = SFX(ld)(P + (2 * m + 1) * LT);
        l1[m] = LRNN_SHUF(x, y, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
              + LRNN_SHUF(x, y, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    }
    for (int m = 0; m < 4; m++)
        l2[m] = LRNN_SHUF(l1[2 * m], l1[2 * m + 1],
                          0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27)
              + LRNN_SHUF(l1[2 * m], l1[2 * m + 1],
                          4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    for (int m = 0; m < 2; m++)
        l3[m] = LRNN_SHUF(l2[2 * m], l2[2 * m + 1],
                          0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29)
              + LRNN_SHUF(l2[2 * m], l2[2 * m + 1],
                          2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    return LRNN_SHUF(l3[0], l3[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
         + LRNN_SHUF(l3[0], l3[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}
#undef LRNN_SHUF
#else
static inline VEC SFX(lrnn_rowsums16)(const SCALAR *P) {
    SCALAR out[LT];
    for (int i = 0; i < LT; i++) out[i] = SFX(lrnn_hsum)(SFX(ld)(P + i * LT));
    VEC x;
    memcpy(&x, out, sizeof x);
    return x;
}
#endif

/* dst[i] = c * (sum of the lanes of P[i]) for i < K; P: (ceil(K / 16) * 16, LT) */
static void SFX(lrnn_rowsums)(SCALAR *restrict dst, const SCALAR *restrict P, long K,
                              SCALAR c) {
    for (long i0 = 0; i0 < K; i0 += 16) {
        const VEC x = c * SFX(lrnn_rowsums16)(P + i0 * LT);
        const long n = K - i0 < 16 ? K - i0 : 16;
        if (n == 16) SFX(st)(dst + i0, x);   /* a fixed-size copy: no libc call */
        else memcpy(dst + i0, &x, sizeof(SCALAR) * n);
    }
}

/* What one backward step reads and writes (pointers into the item's buffers). */
typedef struct {
    const SCALAR *St, *Sp, *R;      /* S_t, S_{t-1} (K, Vp), r_t (Vp) */
    const SCALAR *q, *k, *dec, *dop, *w;
    SCALAR beta, scale;
    SCALAR *dS, *Pq, *Pk, *dv;      /* dS (K, Vp); row-sum parts (K, LT); dv (Vp) */
    VEC G, Db;                      /* the scalar gate's dg and dbeta, per lane */
} SFX(lrnn_bstep_t);

/* The backward of one step over the nt tiles (nt * LT columns) from column j0: rows in the
 * inner loop, the nt tiles of every row in registers, so each row sum (dq, dk, dg) is one
 * tile per row and group, and dL/dw (nt tiles) stays in registers across the rows.
 * nt is a constant at every call, so the tile loops unroll. */
static inline __attribute__((always_inline)) void
SFX(lrnn_bwd_group)(const SFX(lrnn_args_t) *a, SFX(lrnn_bstep_t) *x, long j0, const int nt,
                    const int first) {
    const long K = a->K, Vp = a->Vp;
    const int gated = a->gate != 0, delta = (int)a->delta;
    VEC dov[4], w[4], dw[4], du[4];
    for (int j = 0; j < nt; j++) {
        dov[j] = SFX(ld)(x->dop + j0 + j * LT);
        w[j] = SFX(ld)(x->w + j0 + j * LT);
        dw[j] = (VEC){0};
    }
    /* pass A: dS += scale q do^T; dq = S_t do; dk = dS w; dw = dS^T k; without the delta
     * rule also dS <- a_t . dS (the gate's dg then comes from dq and dk: lrnn_bwd_item) */
    for (long i = 0; i < K; i++) {
        SCALAR *dSi = x->dS + i * Vp + j0;
        const SCALAR *Sti = x->St + i * Vp + j0;
        const SCALAR sq = x->scale * x->q[i], ki = x->k[i];
        VEC aq = {0}, ak = {0};
        for (int j = 0; j < nt; j++) {
            const VEC d = SFX(ld)(dSi + j * LT) + sq * dov[j];
            aq += SFX(ld)(Sti + j * LT) * dov[j];
            ak += d * w[j];
            dw[j] += ki * d;
            SFX(st)(dSi + j * LT, !delta && gated ? d * x->dec[i] : d);
        }
        SFX(lrnn_part)(x->Pq + i * LT, aq, first);
        SFX(lrnn_part)(x->Pk + i * LT, ak, first);
    }
    if (!delta) {
        for (int j = 0; j < nt; j++) SFX(st)(x->dv + j0 + j * LT, dw[j]);
        return;
    }
    for (int j = 0; j < nt; j++) {
        SFX(st)(x->dv + j0 + j * LT, x->beta * dw[j]);
        x->Db += dw[j] * SFX(ld)(x->R + j0 + j * LT);
        du[j] = -x->beta * dw[j];
    }
    /* pass B (delta): w = beta (v - S'^T k): dk += S' du, dS += k du^T (now dL/dS'); then
     * the gate's dg = sum_j dS S_{t-1} (times a_t below) and dS <- a_t . dS */
    for (long i = 0; i < K; i++) {
        SCALAR *dSi = x->dS + i * Vp + j0;
        const SCALAR *Spi = x->Sp + i * Vp + j0;
        const SCALAR ki = x->k[i], di = gated ? x->dec[i] : 1;
        VEC ak = {0}, ag = {0};
        for (int j = 0; j < nt; j++) {
            const VEC sp = SFX(ld)(Spi + j * LT);
            ak += (di * sp) * du[j];
            const VEC d = SFX(ld)(dSi + j * LT) + ki * du[j];
            if (gated) {
                ag += d * sp;
                SFX(st)(dSi + j * LT, d * di);
            } else {
                SFX(st)(dSi + j * LT, d);
            }
        }
        SFX(lrnn_part)(x->Pk + i * LT, ak, 0);
        if (gated) x->G += ag;   /* the scalar gate: a vector gate has no delta rule */
    }
}

static void SFX(lrnn_bwd_item)(const void *args, long item) {
    SFX(lrnn_args_t) *a = (SFX(lrnn_args_t) *)args;
    const long b = item / a->H, h = item % a->H, K = a->K, V = a->V, Vp = a->Vp, C = a->C;
    const long H = a->H, T = a->T, KVp = K * Vp, K16 = (K + 15) / 16 * 16;
    const int gated = a->gate != 0, vector_gate = a->gate == 2, delta = (int)a->delta;
    /* Sbuf (C + 1, K, Vp): S_{t0-1} .. S_{t0+C-1}; R (C, Vp): r_t; dS (K, Vp);
     * v, do, dv, w (Vp); dec, qn, kn, gacc (K); Pq, Pk (K16, LT): per-lane parts of the
     * row sums, rows past K zero */
    SCALAR *buf = SFX(lrnn_buffer)((C + 1) * KVp + C * Vp + KVp + 4 * Vp + 4 * K
                                   + 2 * K16 * LT);
    if (!buf) { atomic_store(&a->failed, 1); return; }
    SCALAR *Sbuf = buf, *R = Sbuf + (C + 1) * KVp, *dS = R + C * Vp, *vpad = dS + KVp;
    SCALAR *dopad = vpad + Vp, *dvpad = dopad + Vp, *wpad = dvpad + Vp, *dec = wpad + Vp;
    SCALAR *gacc = dec + 3 * K, *Pq = gacc + K, *Pk = Pq + K16 * LT;
    /* Gates without the delta rule: dg from the identity dL/db_t = q_t . dq_t - k_t . dk_t
     * (per key row), b_t = g_1 + .. + g_t the cumulative log gate (S_t's terms are
     * exp(b_t - b_s) k_s v_s^T and exp(b_t) h0), so dg_t = sum over tau >= t of it, plus
     * dL/db_T = sum_j dS_T S_T from the final state: a running sum of K numbers per step
     * (gacc) instead of a pass over the state (the form fla's chunked GLA backward uses). */
    const int dg_by_sums = gated && !delta;
    SFX(lrnn_in_t) in = {.vbuf = vpad, .dec = dec, .qn = dec + K, .kn = dec + 2 * K};
    const int padded = V != Vp;   /* else do_t and dv_t are used in place */
    if (a->dS_last) SFX(lrnn_pad)(dS, a->dS_last + item * K * V, K, V, Vp);
    for (long c = a->n_chunks - 1; c >= 0; c--) {
        const long t0 = c * C,
                   steps = SFX(lrnn_ckpt_restore)(Sbuf, a->ckpt, item, a->n_chunks, C, T, c, KVp);
        for (long s = 0; s < steps; s++) {
            SFX(lrnn_load)(a, b, t0 + s, h, &in);
            SFX(lrnn_step)(a, Sbuf + (s + 1) * KVp, Sbuf + s * KVp, &in, R + s * Vp, NULL);
        }
        if (dg_by_sums && c == a->n_chunks - 1) {   /* dL/db_T = sum_j dS_T S_T */
            const SCALAR *ST = Sbuf + steps * KVp;
            for (long i = 0; i < K; i++) {
                VEC acc = {0};
                for (long j = 0; j < Vp; j += LT)
                    acc += SFX(ld)(dS + i * Vp + j) * SFX(ld)(ST + i * Vp + j);
                gacc[i] = SFX(lrnn_hsum)(acc);
            }
        }
        for (long s = steps - 1; s >= 0; s--) {
            const long t = t0 + s, row_bth = (b * T + t) * H + h;
            SFX(lrnn_load)(a, b, t, h, &in);
            if (t >= LRNN_PREFETCH) {   /* the rows a few steps back: do read, the rest written */
                const long rp = row_bth - LRNN_PREFETCH * H;
                SFX(lrnn_prefetch)(a->d_o + rp * V, V, 0);
                SFX(lrnn_prefetch)(a->dv + rp * V, V, 1);
                SFX(lrnn_prefetch)(a->dq + rp * K, K, 1);
                SFX(lrnn_prefetch)(a->dk + rp * K, K, 1);
                if (vector_gate) SFX(lrnn_prefetch)(a->dg + rp * K, K, 1);
            }
            const SCALAR *do_t = a->d_o + row_bth * V;
            SCALAR *dv_t = a->dv + row_bth * V;
            const SCALAR *Rs = R + s * Vp;
            for (long j = 0; j < Vp; j += LT)
                SFX(st)(wpad + j, delta ? in.beta * SFX(ld)(Rs + j) : SFX(ld)(in.v + j));
            SFX(lrnn_bstep_t) x = {
                .St = Sbuf + (s + 1) * KVp, .Sp = Sbuf + s * KVp, .R = Rs, .q = in.q,
                .k = in.k, .dec = dec, .dop = SFX(lrnn_padded)(do_t, dopad, V, Vp), .w = wpad,
                .beta = in.beta, .scale = a->scale, .dS = dS, .Pq = Pq, .Pk = Pk,
                .dv = padded ? dvpad : dv_t};
            LRNN_GROUPS(Vp, SFX(lrnn_bwd_group)(a, &x, j0, NT, j0 == 0));
            SCALAR *dq_t = a->dq + row_bth * K, *dk_t = a->dk + row_bth * K;
            SFX(lrnn_rowsums)(dq_t, Pq, K, a->scale);
            SFX(lrnn_rowsums)(dk_t, Pk, K, 1);
            if (dg_by_sums) {
                const SCALAR *q_t = in.q, *k_t = in.k;
                SCALAR tot = 0;
                for (long i = 0; i < K; i++) {
                    gacc[i] += q_t[i] * dq_t[i] - k_t[i] * dk_t[i];
                    tot += gacc[i];
                }
                if (vector_gate) memcpy(a->dg + row_bth * K, gacc, sizeof(SCALAR) * K);
                else a->dg[row_bth] = tot;
            } else if (gated) {
                a->dg[row_bth] = dec[0] * SFX(lrnn_hsum)(x.G);
            }
            if (delta) a->dbeta[row_bth] = SFX(lrnn_hsum)(x.Db);
            if (a->l2norm) {
                SFX(lrnn_l2_back)(in.qn, in.q_norm, dq_t, K);
                SFX(lrnn_l2_back)(in.kn, in.k_norm, dk_t, K);
            }
            if (padded) memcpy(dv_t, dvpad, sizeof(SCALAR) * V);
        }
    }
    SFX(lrnn_unpad)(a->dh0 + item * K * V, dS, K, V, Vp);
    free(buf);
}

int SFX(lrnn_fwd)(void *const *p, const long *s) {
    SFX(lrnn_args_t) a;
    SFX(lrnn_unpack)(&a, p, s, 0);
    return run_items(SFX(lrnn_fwd_item), &a, &a.failed, a.B * a.H, s[8]);
}

int SFX(lrnn_bwd)(void *const *p, const long *s) {
    SFX(lrnn_args_t) a;
    SFX(lrnn_unpack)(&a, p, s, 1);
    return run_items(SFX(lrnn_bwd_item), &a, &a.failed, a.B * a.H, s[8]);
}

#undef AT
#undef LT
#undef LRNN_PREFETCH
#undef VEC
