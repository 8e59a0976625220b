/* The CPU bank of built-in filters as one compiled pass per block of rows x channels (tsconv/kernels/filterbank_native.py).

   It does the torch path's float64 operations (tsconv/kernels/filterbank.py: the ladder E_{j+1}(t) =
   E_j(t - h d) + E_j(t), each window's segments newest first, the moments' pairwise merge, the finishes), in
   the same order and with the same roundings, so it gives that path's bits; what changes is that a block's
   ladder stays in cache and every output row is written once. Build: no fast-math and -ffp-contract=off
   (a fused multiply-add would round differently from torch's two operations). */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { K_ID = 0, K_LAG = 1, K_DIFF = 2, K_MA = 3, K_DEV = 4, K_STD = 5, K_ZSCORE = 6 };
#define MAX_FILTERS 64
#define MAX_WINDOWS 16
#define GROUP_CHANNELS 64 /* channels a task computes side by side (their rings: about 64 KB a block of 16) */

typedef struct {
    int64_t w;      /* window length in steps */
    int top;        /* highest set bit of w */
    int moments;    /* a std or zscore reads it */
    double *s, *m;  /* the window's sum and sum of squared deviations at the current row, when summed */
    double *mu;     /* the mean of the segments joined so far (a std or z-score's, of 3+ binary digits) */
    const double *sp, *mp; /* where they are for the current row (s and m, or a level's ring row) */
} window_t;

static int is_window(int kind) { return kind >= K_MA && kind <= K_ZSCORE; }

static double mean_of(double s, int64_t w) {
    /* torch's _mean: a multiplication where 1 / w is exact (a power of two), else a division */
    return (w & (w - 1)) == 0 ? s * (1.0 / (double)w) : s / (double)w;
}

/* torch's _TorchOps.merge: (sb ib - sa ia)^2 coef + (ma + mb) */
static inline double merge(double sa, double ma, double sb, double mb, double ia, double ib, double coef) {
    double delta = sb * ib - sa * ia;
    double sq = delta * delta;
    sq = sq * coef;
    return sq + (ma + mb);
}

/* torch's _TorchOps.mean_join: mu mi - (mu mi - s i) w. A mean carried from segment to segment, not a sum /
   its count: of a flat float64 window that sum rounds (3v) and the mean it gives is an ulp off v, which gave
   flat windows a standard deviation of 1e-14 */
static inline double mean_join(double mu, double mi, double s, double i, double w) {
    mu = mu * mi;
    double delta = mu - s * i;
    delta = delta * w;
    return mu - delta;
}

/* out[k * M + f] = planes[f * CB + k] for k in [k0, CB): a constant M and CB let the compiler use shuffles */
#define INTERLEAVE(MM)                                                                                       \
    static inline __attribute__((always_inline)) void interleave_##MM(float *restrict out,                 \
                                                                      const float *restrict planes,         \
                                                                      const int CB, int k0) {              \
        for (int k = k0; k < CB; k++)                                                                        \
            for (int f = 0; f < MM; f++) out[k * MM + f] = planes[f * CB + k];                               \
    }
INTERLEAVE(1)
INTERLEAVE(2)
INTERLEAVE(3)
INTERLEAVE(4)
INTERLEAVE(5)
INTERLEAVE(6)
INTERLEAVE(7)
INTERLEAVE(8)

static inline __attribute__((always_inline)) void interleave(float *restrict out, const float *restrict planes,
                                                             int M, const int CB, int k0) {
    switch (M) {
    case 1: interleave_1(out, planes, CB, k0); return;
    case 2: interleave_2(out, planes, CB, k0); return;
    case 3: interleave_3(out, planes, CB, k0); return;
    case 4: interleave_4(out, planes, CB, k0); return;
    case 5: interleave_5(out, planes, CB, k0); return;
    case 6: interleave_6(out, planes, CB, k0); return;
    case 7: interleave_7(out, planes, CB, k0); return;
    case 8: interleave_8(out, planes, CB, k0); return;
    default:
        for (int k = k0; k < CB; k++)
            for (int f = 0; f < M; f++) out[k * M + f] = planes[f * CB + k];
    }
}

/* four doubles: a row of a block's levels is CB / 4 of them (scratch is 64-byte aligned and rows are whole
   vectors, so these loads and stores are aligned) */
typedef double v4d __attribute__((vector_size(32)));

/* The statement for g = 0 .. CB / 4 - 1, each with a constant g: the row's vectors (cur, curm) then live in
   registers only. Written as a loop over g, gcc kept them in a stack array as well and stored them there at every
   ladder level (4 more stores a level; 14.0-14.4 -> 12.6-13.0 ms a 65,536 x 40 chunk without them). */
#define FOR_G(...)                                                                                           \
    do {                                                                                                     \
        { const int g = 0; __VA_ARGS__; }                                                                    \
        if (CB / 4 > 1) { const int g = 1; __VA_ARGS__; }                                                    \
        if (CB / 4 > 2) { const int g = 2; __VA_ARGS__; }                                                    \
        if (CB / 4 > 3) { const int g = 3; __VA_ARGS__; }                                                    \
    } while (0)

/* the channel loops' pointers never overlap (rings of different levels, the row buffer, the input) */
#define IVDEP _Pragma("GCC ivdep") _Pragma("GCC unroll 1")

typedef struct {
    int M, nw, top, mtop;
    const int32_t *kinds;
    const int64_t *params;
    int wof[MAX_FILTERS];
    window_t win[MAX_WINDOWS];
    int64_t ring_rows[64], mask[64], lo[64];
    size_t ring_at[64], window_at, total; /* in CB-wide rows of doubles */
} plan_t;

/* The bank's windows and the ladder's rings. Ring j holds level j at the rows still to be read: 2^j d back by
   level j + 1, off d back by a window's segment (off < 2^j); a power of two, so a row's slot is its index
   masked. */
static int make_plan(plan_t *p, int M, const int32_t *kinds, const int64_t *params, int64_t d) {
    if (M > MAX_FILTERS) return -1;
    p->M = M;
    p->kinds = kinds;
    p->params = params;
    p->nw = 0;
    p->top = p->mtop = -1;
    for (int f = 0; f < M; f++) {
        p->wof[f] = -1;
        if (!is_window(kinds[f])) continue;
        if (params[f] < 1) return -1;
        int moments = kinds[f] == K_STD || kinds[f] == K_ZSCORE;
        int i = 0;
        while (i < p->nw && p->win[i].w != params[f]) i++;
        if (i == p->nw) {
            if (p->nw == MAX_WINDOWS) return -1;
            p->win[i].w = params[f];
            p->win[i].top = 63 - __builtin_clzll((unsigned long long)params[f]);
            p->win[i].moments = 0;
            p->nw++;
        }
        if (moments) p->win[i].moments = 1;
        p->wof[f] = i;
        if (p->win[i].top > p->top) p->top = p->win[i].top;
        if (moments && p->win[i].top > p->mtop) p->mtop = p->win[i].top;
    }
    size_t total = 0;
    for (int j = 0; j <= p->top; j++) {
        int64_t back = j < p->top ? (1LL << j) * d : 0;
        for (int wi = 0; wi < p->nw; wi++) {
            if (!((p->win[wi].w >> j) & 1)) continue;
            int64_t off = (p->win[wi].w & ((1LL << j) - 1)) * d;
            if (off > back) back = off;
        }
        int64_t size = 1;
        while (size < back + 1) size <<= 1;
        p->ring_rows[j] = size;
        p->mask[j] = size - 1;
        p->lo[j] = ((1LL << j) - 1) * d; /* level j's first valid tile row */
        p->ring_at[j] = total;
        total += (size_t)size * (j <= p->mtop ? 2 : 1);
    }
    p->window_at = total;
    p->total = total + (size_t)p->nw * 3; /* each window's sum, moments and mean at the current row */
    return 0;
}

/* The tasks of one channel-block width CB (a constant after inlining: fixed-length loops over a block's
   channels, no alias checks; with CB a runtime value each row's dozen short loops cost more than their work). */
/* An input value as a double: x is float32 or, with wide, float64 (WIDE a constant after inlining). */
#define XAT(ptr, k) (WIDE ? ((const double *)(ptr))[k] : (double)((const float *)(ptr))[k])

static inline __attribute__((always_inline)) int run_tasks(plan_t *p, const void *x, int64_t sx_row, int64_t n,
                                                           int64_t C, int64_t halo, int64_t d, float *out,
                                                           int64_t so_row, int64_t so_col, int64_t R,
                                                           int64_t task0, int64_t step, const int CB,
                                                           const int WIDE) {
    const int64_t esz = WIDE ? 8 : 4; /* bytes an input value */
    const int M = p->M, top = p->top, mtop = p->mtop, nw = p->nw;
    const int32_t *kinds = p->kinds;
    const int64_t *params = p->params;
    /* a task's channel blocks side by side, so each output row's part is written whole at once (block by block
       over a task's rows, each output line shared by two blocks was written, evicted and read back) */
    const int64_t ncb = (C + CB - 1) / CB;
    const int64_t G = ncb < GROUP_CHANNELS / CB ? ncb : GROUP_CHANNELS / CB;
    const int64_t ngroups = (ncb + G - 1) / G;
    const size_t ring_stride = p->window_at * CB; /* one block's rings, in doubles */
    double *scratch = NULL; /* 64-byte aligned: a block's row of levels is whole cache lines */
    size_t doubles = G * ring_stride + (size_t)nw * 3 * CB;
    if (posix_memalign((void **)&scratch, 64, doubles * sizeof(double) + (size_t)CB * M * sizeof(float)))
        return -1;
    float *rowbuf = (float *)(scratch + doubles);
    window_t *win = p->win;
    for (int wi = 0; wi < nw; wi++) {
        win[wi].s = scratch + G * ring_stride + 3 * wi * CB;
        win[wi].m = win[wi].s + CB;
        win[wi].mu = win[wi].s + 2 * CB;
    }
    const int64_t ntasks = ((n + R - 1) / R) * ngroups;
    for (int64_t task = task0; task < ntasks; task += step) {
        const int64_t b0 = (task % ngroups) * G;
        const int64_t b1 = b0 + G < ncb ? b0 + G : ncb;
        const int64_t o0 = (task / ngroups) * R;
        const int64_t rows = (n - o0 < R) ? n - o0 : R;
        const int64_t tl = rows + halo; /* tile rows: input rows o0 .. o0 + tl */
        if (top >= 0) memset(scratch, 0, (b1 - b0) * ring_stride * sizeof(double));
        for (int64_t i = 0; i < tl; i++) {
          for (int64_t b = b0; b < b1; b++) {
            /* the last block ends at the last channel, overlapping the one before: it writes only its new ones */
            const int64_t c0 = b * CB + CB <= C ? b * CB : C - CB;
            const int k0 = (int)(b * CB - c0);
            double *rb = scratch + (b - b0) * ring_stride;
            const char *restrict xr = (const char *)x + ((o0 + i) * sx_row + c0) * esz;
            if (top >= 0) {
                /* the row's current level stays in registers (cur, curm: CB / 4 vectors each): reloading each
                   level from its ring made the eight levels one chain of stores and loads per row */
                v4d cur[4], curm[4]; /* CB / 4 of each used */
                double *l0 = rb + (p->ring_at[0] + (size_t)(i & p->mask[0])) * CB;
                FOR_G({
                    cur[g] = (v4d){XAT(xr, 4 * g), XAT(xr, 4 * g + 1), XAT(xr, 4 * g + 2), XAT(xr, 4 * g + 3)};
                    curm[g] = (v4d){0.0, 0.0, 0.0, 0.0};
                    *(v4d *)(l0 + 4 * g) = cur[g];
                });
                for (int j = 0; j < top; j++) {
                    if (i < p->lo[j + 1]) break; /* the higher levels start later still */
                    const int64_t sh = (1LL << j) * d;
                    const double *so = rb + (p->ring_at[j] + (size_t)((i - sh) & p->mask[j])) * CB;
                    double *dn = rb + (p->ring_at[j + 1] + (size_t)(i & p->mask[j + 1])) * CB;
                    if (j < mtop) {
                        /* moments ring j follows ring j's sums; level 0's are zeros (torch: None) */
                        const double *mo = so + p->ring_rows[j] * CB;
                        double *dm = dn + p->ring_rows[j + 1] * CB;
                        const double ia = 1.0 / (double)(1LL << j), coef = (double)(1LL << j) / 2.0;
                        FOR_G({
                            v4d delta = cur[g] * ia - *(const v4d *)(so + 4 * g) * ia;
                            curm[g] = (delta * delta) * coef + (*(const v4d *)(mo + 4 * g) + curm[g]);
                            *(v4d *)(dm + 4 * g) = curm[g];
                        });
                    }
                    FOR_G({
                        cur[g] = *(const v4d *)(so + 4 * g) + cur[g];
                        *(v4d *)(dn + 4 * g) = cur[g];
                    });
                }
            }
            if (i < halo) continue;
            const int64_t r = i - halo;
            /* each window's sum (and moments) at this row: its segments newest first */
            for (int wi = 0; wi < nw; wi++) {
                window_t *wn = &win[wi];
                double *restrict ws = wn->s, *restrict wm = wn->m, *restrict wmu = wn->mu;
                if ((wn->w & (wn->w - 1)) == 0) { /* one level: read in place */
                    wn->sp = rb + (p->ring_at[wn->top] + (size_t)(i & p->mask[wn->top])) * CB;
                    wn->mp = wn->sp + p->ring_rows[wn->top] * CB;
                    continue;
                }
                wn->sp = ws;
                wn->mp = wm;
                int64_t acc_n = 0;
                for (int j = 0; j <= wn->top; j++) {
                    if (!((wn->w >> j) & 1)) continue;
                    const int64_t size = 1LL << j;
                    const double *restrict seg =
                        rb + (p->ring_at[j] + (size_t)((i - acc_n * d) & p->mask[j])) * CB;
                    const double *restrict segm = seg + p->ring_rows[j] * CB;
                    if (acc_n == 0) {
                        IVDEP for (int k = 0; k < CB; k++) ws[k] = seg[k];
                        if (wn->moments)
                            IVDEP for (int k = 0; k < CB; k++) wm[k] = segm[k];
                    } else {
                        if (wn->moments) {
                            /* the first segment alone: its sum (exact over a power of two), else the mean */
                            const int first = (acc_n & (acc_n - 1)) == 0;
                            const double ia = 1.0 / (double)size, ib = first ? 1.0 / (double)acc_n : 1.0;
                            const double coef = (double)(size * acc_n) / (double)(size + acc_n);
                            const int follows = (wn->w >> (j + 1)) != 0; /* another segment, older */
                            const double wt = (double)size / (double)(size + acc_n);
                            if (first) {
                                IVDEP for (int k = 0; k < CB; k++) wm[k] = merge(seg[k], segm[k], ws[k], wm[k], ia, ib, coef);
                                if (follows)
                                    IVDEP for (int k = 0; k < CB; k++) wmu[k] = mean_join(ws[k], ib, seg[k], ia, wt);
                            } else {
                                IVDEP for (int k = 0; k < CB; k++) wm[k] = merge(seg[k], segm[k], wmu[k], wm[k], ia, 1.0, coef);
                                if (follows)
                                    IVDEP for (int k = 0; k < CB; k++) wmu[k] = mean_join(wmu[k], 1.0, seg[k], ia, wt);
                            }
                        }
                        IVDEP for (int k = 0; k < CB; k++) ws[k] = seg[k] + ws[k];
                    }
                    acc_n += size;
                }
            }
            /* every filter into its own contiguous plane of the row buffer, then interleaved into the output */
            for (int f = 0; f < M; f++) {
                const int kind = kinds[f];
                float *restrict o = rowbuf + f * CB;
                if (kind == K_ID) {
                    IVDEP for (int k = 0; k < CB; k++) o[k] = (float)XAT(xr, k);
                } else if (kind == K_LAG || kind == K_DIFF) {
                    const char *restrict xl = xr - params[f] * d * sx_row * esz;
                    if (kind == K_LAG)
                        IVDEP for (int k = 0; k < CB; k++) o[k] = (float)XAT(xl, k);
                    else if (WIDE) /* float64's difference, rounded once (the torch path's) */
                        IVDEP for (int k = 0; k < CB; k++) o[k] = (float)(XAT(xr, k) - XAT(xl, k));
                    else /* float32's: the correctly rounded difference of two float32 values */
                        IVDEP for (int k = 0; k < CB; k++) o[k] = ((const float *)xr)[k] - ((const float *)xl)[k];
                } else {
                    const window_t *wn = &win[p->wof[f]];
                    const int64_t w = wn->w;
                    const double *restrict s = wn->sp;
                    if (kind == K_MA) {
                        IVDEP for (int k = 0; k < CB; k++) o[k] = (float)mean_of(s[k], w);
                    } else if (kind == K_DEV) {
                        if ((w & (w - 1)) == 0) {
                            const double inv = 1.0 / (double)w; /* exact: s * inv rounds nothing */
                            IVDEP for (int k = 0; k < CB; k++) o[k] = (float)(XAT(xr, k) - s[k] * inv);
                        } else {
                            const double wd = (double)w;
                            IVDEP for (int k = 0; k < CB; k++) o[k] = (float)(XAT(xr, k) - s[k] / wd);
                        }
                    } else {
                        const double *restrict m = wn->mp;
                        const double den = (double)(w - 1 > 1 ? w - 1 : 1);
                        IVDEP for (int k = 0; k < CB; k++) {
                            double sd = sqrt(m[k] / den);
                            if (kind == K_STD) {
                                o[k] = isfinite(s[k]) ? (float)sd : NAN;
                            } else {
                                double z = (XAT(xr, k) - mean_of(s[k], w)) / sd;
                                o[k] = sd > 0 && isfinite(sd) ? (float)z : NAN;
                            }
                        }
                    }
                }
            }
            if (so_col == 1) {
                interleave(out + (o0 + r) * so_row + c0 * M, rowbuf, M, CB, k0);
            } else { /* feature-major (a polars frame's columns): each output's value of this row in its column */
                float *o = out + (o0 + r) * so_row;
                for (int k = k0; k < CB; k++)
                    for (int f = 0; f < M; f++) o[((c0 + k) * M + f) * so_col] = rowbuf[f * CB + k];
            }
          }
        }
    }
    free(scratch);
    return 0;
}

/* Tasks task0, task0 + step, ... of the grid of blocks (rows_per_task output rows x a block of channels, the
   channel block varying fastest). x: float32 (or with wide, float64) with contiguous channels, element (i, c)
   at x[i * sx_row + c],
   n + halo rows; out: float32 [n, C * M], element (t, j) at out[t * so_row + j * so_col] (row-major: so_col 1;
   feature-major: so_row 1). Each block walks its rows once, oldest first: level j + 1
   of the ladder at a row is level j there plus level j 2^j d rows before, each level kept in a ring of the
   rows still to be read (the working set stays in a core's cache), and every filter's output of a row is
   finished as soon as its levels are, then written whole. Returns 0, or -1 when it cannot allocate its
   scratch or the bank is too large for its tables. */
int tsconv_bank(const void *x, int64_t sx_row, int64_t n, int64_t C, int64_t halo, int64_t d, int M,
                const int32_t *kinds, const int64_t *params, float *out, int64_t so_row, int64_t so_col,
                int64_t rows_per_task, int64_t task0, int64_t step, int wide) {
    plan_t p;
    if (rows_per_task <= 0 || C <= 0 || make_plan(&p, M, kinds, params, d) != 0) return -1;
#define RUN(CB, W) run_tasks(&p, x, sx_row, n, C, halo, d, out, so_row, so_col, rows_per_task, task0, step, CB, W)
    if (wide) {
        if (C >= 16) return RUN(16, 1);
        if (C >= 8) return RUN(8, 1);
        if (C >= 4) return RUN(4, 1);
    } else {
        if (C >= 16) return RUN(16, 0);
        if (C >= 8) return RUN(8, 0);
        if (C >= 4) return RUN(4, 0);
    }
#undef RUN
    return -1; /* fewer than 4 channels: the torch path */
}

/* The number of tasks tsconv_bank splits a call into (so callers give each thread a share). */
int64_t tsconv_bank_tasks(int64_t n, int64_t C, int64_t rows_per_task) {
    int64_t cb = C >= 16 ? 16 : C >= 8 ? 8 : 4;
    int64_t ncb = (C + cb - 1) / cb, g = ncb < GROUP_CHANNELS / cb ? ncb : GROUP_CHANNELS / cb;
    return ((n + rows_per_task - 1) / rows_per_task) * ((ncb + g - 1) / g);
}
