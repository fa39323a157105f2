/* Body of gated_norm.c for one scalar type REAL (suffix SFX, sigmoid SIGMOID); the layout
 * and the entry points' arguments are in gated_norm.c's comment. */

/* one item's rows [r0, r1) of the forward */
static void SFX(gn_fwd_rows)(void **p, const long *s, long r0, long r1) {
    const REAL eps = (REAL)*(const double *)p[0];
    const REAL *x = (const REAL *)p[1], *z = (const REAL *)p[2], *w = (const REAL *)p[3];
    REAL *out = (REAL *)p[4], *rstd = (REAL *)p[5];
    const long G = s[1], gs = s[2], nbg = s[3], sig = s[4], sx = s[7], sz = s[8];
    const long d = G * gs;
    for (long row = r0; row < r1; row++) {
        for (long g = 0; g < G; g++) {
            const REAL *restrict xr = x + row * sx + g * gs, *restrict zr = z + row * sz + g * gs;
            const REAL *restrict wr = w + g * gs;
            REAL *restrict o = out + row * d + g * gs;
            REAL ss = 0;
            if (!nbg) {            /* h = x a(z) into out, then out = h r w */
#pragma omp simd reduction(+ : ss)
                for (long c = 0; c < gs; c++) {
                    const REAL sg = SIGMOID(zr[c]);
                    const REAL h = xr[c] * (sig ? sg : zr[c] * sg);
                    o[c] = h;
                    ss += h * h;
                }
                const REAL r = (REAL)(1 / sqrt((double)(ss / (REAL)gs + eps)));
#pragma omp simd
                for (long c = 0; c < gs; c++) o[c] = o[c] * r * wr[c];
                if (rstd) rstd[row * G + g] = r;
            } else {               /* out = x r w a(z) */
#pragma omp simd reduction(+ : ss)
                for (long c = 0; c < gs; c++) ss += xr[c] * xr[c];
                const REAL r = (REAL)(1 / sqrt((double)(ss / (REAL)gs + eps)));
#pragma omp simd
                for (long c = 0; c < gs; c++) {
                    const REAL sg = SIGMOID(zr[c]);
                    o[c] = xr[c] * r * wr[c] * (sig ? sg : zr[c] * sg);
                }
                if (rstd) rstd[row * G + g] = r;
            }
        }
    }
}

/* one item's rows [r0, r1) of the backward; dw: the item's (d,) partial sums */
static void SFX(gn_bwd_rows)(void **p, const long *s, long r0, long r1, REAL *restrict dw) {
    const REAL *x = (const REAL *)p[1], *z = (const REAL *)p[2], *w = (const REAL *)p[3];
    const REAL *rstd = (const REAL *)p[4], *dy = (const REAL *)p[5];
    REAL *dx = (REAL *)p[6], *dz = (REAL *)p[7];
    const long G = s[1], gs = s[2], nbg = s[3], sig = s[4], sx = s[7], sz = s[8], sdy = s[9];
    const long d = G * gs;
    for (long row = r0; row < r1; row++) {
        for (long g = 0; g < G; g++) {
            const REAL *restrict xr = x + row * sx + g * gs, *restrict zr = z + row * sz + g * gs;
            const REAL *restrict dyr = dy + row * sdy + g * gs, *restrict wr = w + g * gs;
            REAL *restrict dxr = dx + row * d + g * gs, *restrict dzr = dz + row * d + g * gs;
            REAL *restrict dwr = dw + g * gs;
            const REAL r = rstd[row * G + g];
            REAL dot = 0;
            if (!nbg) {
                /* h = x a(z), x_hat = h r, y = x_hat w: dh = r (dy w - x_hat mean(dy w x_hat)),
                 * dx = dh a(z), dz = dh x a'(z); pass 1 keeps x_hat in dx and sigmoid in dz */
#pragma omp simd reduction(+ : dot)
                for (long c = 0; c < gs; c++) {
                    const REAL sg = SIGMOID(zr[c]);
                    const REAL xh = xr[c] * (sig ? sg : zr[c] * sg) * r;
                    dot += dyr[c] * wr[c] * xh;
                    dwr[c] += dyr[c] * xh;
                    dxr[c] = xh;
                    dzr[c] = sg;
                }
                const REAL m = dot / (REAL)gs;
#pragma omp simd
                for (long c = 0; c < gs; c++) {
                    const REAL sg = dzr[c], zc = zr[c];
                    const REAL dh = r * (dyr[c] * wr[c] - dxr[c] * m);
                    dxr[c] = dh * (sig ? sg : zc * sg);
                    dzr[c] = dh * xr[c] * (sig ? sg * (1 - sg) : sg * (1 + zc * (1 - sg)));
                }
            } else {
                /* x_hat = x r, n = x_hat w, y = n a(z): dz = dy n a'(z), dn = dy a(z),
                 * dx = r (dn w - x_hat mean(dn w x_hat)); pass 1 keeps dn w in dx */
#pragma omp simd reduction(+ : dot)
                for (long c = 0; c < gs; c++) {
                    const REAL sg = SIGMOID(zr[c]), zc = zr[c];
                    const REAL xh = xr[c] * r;
                    const REAL dn = dyr[c] * (sig ? sg : zc * sg);
                    dzr[c] = dyr[c] * xh * wr[c] * (sig ? sg * (1 - sg) : sg * (1 + zc * (1 - sg)));
                    dot += dn * wr[c] * xh;
                    dwr[c] += dn * xh;
                    dxr[c] = dn * wr[c];
                }
                const REAL m = dot / (REAL)gs;
#pragma omp simd
                for (long c = 0; c < gs; c++) dxr[c] = r * (dxr[c] - xr[c] * r * m);
            }
        }
    }
}

int SFX(gn_fwd)(void **p, long *s) {
    const long rows = s[0], items = s[6];
    const int threads = (int)(s[5] < 1 ? 1 : s[5]);
    const long per = items > 0 ? (rows + items - 1) / items : 0;
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long i = 0; i < items; i++) {
        const long r0 = i * per, r1 = r0 + per < rows ? r0 + per : rows;
        if (r0 < r1) SFX(gn_fwd_rows)(p, s, r0, r1);
    }
    return 0;
}

int SFX(gn_bwd)(void **p, long *s) {
    const long rows = s[0], items = s[6], d = s[1] * s[2];
    const int threads = (int)(s[5] < 1 ? 1 : s[5]);
    const long per = items > 0 ? (rows + items - 1) / items : 0;
    REAL *dw_part = (REAL *)p[8];
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long i = 0; i < items; i++) {
        const long r0 = i * per, r1 = r0 + per < rows ? r0 + per : rows;
        REAL *dw = dw_part + i * d;
        memset(dw, 0, (size_t)d * sizeof(REAL));
        if (r0 < r1) SFX(gn_bwd_rows)(p, s, r0, r1, dw);
    }
    return 0;
}

/* The D skip and the gate, out = (y + D x) a(z), D per channel: sg_fwd / sg_bwd
 * (gated_norm.c's comment), items of rows as the norm's. */
int SFX(sg_fwd)(void **p, long *s) {
    const REAL *y = (const REAL *)p[1], *x = (const REAL *)p[2], *z = (const REAL *)p[3];
    const REAL *D = (const REAL *)p[4];
    REAL *out = (REAL *)p[5];
    const long rows = s[0], d = s[1], sig = s[2], items = s[4];
    const long sy = s[5], sx = s[6], sz = s[7];
    const int threads = (int)(s[3] < 1 ? 1 : s[3]);
    const long per = items > 0 ? (rows + items - 1) / items : 0;
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long i = 0; i < items; i++) {
        const long r1 = (i + 1) * per < rows ? (i + 1) * per : rows;
        for (long row = i * per; row < r1; row++) {
            const REAL *restrict yr = y + row * sy, *restrict xr = x + row * sx;
            const REAL *restrict zr = z + row * sz;
            REAL *restrict o = out + row * d;
#pragma omp simd
            for (long c = 0; c < d; c++) {
                const REAL sg = SIGMOID(zr[c]);
                o[c] = (yr[c] + D[c] * xr[c]) * (sig ? sg : zr[c] * sg);
            }
        }
    }
    return 0;
}

int SFX(sg_bwd)(void **p, long *s) {
    const REAL *y = (const REAL *)p[1], *x = (const REAL *)p[2], *z = (const REAL *)p[3];
    const REAL *D = (const REAL *)p[4], *dout = (const REAL *)p[5];
    REAL *dy = (REAL *)p[6], *dx = (REAL *)p[7], *dz = (REAL *)p[8], *dD_part = (REAL *)p[9];
    const long rows = s[0], d = s[1], sig = s[2], items = s[4];
    const long sy = s[5], sx = s[6], sz = s[7], sdo = s[8];
    const int threads = (int)(s[3] < 1 ? 1 : s[3]);
    const long per = items > 0 ? (rows + items - 1) / items : 0;
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long i = 0; i < items; i++) {
        REAL *restrict dD = dD_part + i * d;
        memset(dD, 0, (size_t)d * sizeof(REAL));
        const long r1 = (i + 1) * per < rows ? (i + 1) * per : rows;
        for (long row = i * per; row < r1; row++) {
            const REAL *restrict yr = y + row * sy, *restrict xr = x + row * sx;
            const REAL *restrict zr = z + row * sz, *restrict g = dout + row * sdo;
            REAL *restrict dyr = dy + row * d, *restrict dxr = dx + row * d;
            REAL *restrict dzr = dz + row * d;
#pragma omp simd
            for (long c = 0; c < d; c++) {
                const REAL sg = SIGMOID(zr[c]), zc = zr[c];
                const REAL pre = yr[c] + D[c] * xr[c];
                const REAL gy = g[c] * (sig ? sg : zc * sg);
                dyr[c] = gy;
                dxr[c] = gy * D[c];
                dD[c] += gy * xr[c];
                dzr[c] = g[c] * pre * (sig ? sg * (1 - sg) : sg * (1 + zc * (1 - sg)));
            }
        }
    }
    return 0;
}
