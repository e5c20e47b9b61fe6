/* Training curves to PNG with cairo (see plot.h). */
#include "common/monitor/plot.h"
#include "common/base/err.h"
#include "common/monitor/plot_events.h"

#include <cairo/cairo.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PLOT_MAX_SERIES 6

typedef struct {
    const char *label;
    double r, g, b, width;
    const double *y;            /* n values (NaN = gap), x = xs */
} series_t;

typedef struct {
    const char *title, *ylabel;
    int logy;
    double ylo, yhi;            /* the y range's data (both finite: from these, not the series) */
    series_t s[PLOT_MAX_SERIES];
    int ns;
    const mon_plot_mark_t *marks;   /* events, vertical lines (labels where label_marks) */
    int nm, label_marks;
} panel_t;

/* The plot area of a panel and its axes' mapping. */
typedef struct {
    double px, py, pw, ph;
    double xmin, xmax, ly0, ly1;
    int logy;
} area_t;

static double xp(const area_t *a, double x) { return a->px + (x - a->xmin) / (a->xmax - a->xmin) * a->pw; }
static double yp(const area_t *a, double v) {
    return a->py + a->ph - ((a->logy ? log10(v) : v) - a->ly0) / (a->ly1 - a->ly0) * a->ph;
}

/* 1, 2, 5 x 10^k at or above x (Heckbert, "Nice numbers for graph labels", Graphics Gems 1990). */
static double nice_step(double range, int ticks) {
    double raw = range / (ticks > 1 ? ticks : 1);
    if (!(raw > 0)) return 1;
    double e = pow(10, floor(log10(raw)));
    double f = raw / e;
    double n = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
    return n * e;
}

static void fmt_tick(double v, double step, char *out, size_t cap) {
    if (v != 0 && (fabs(v) >= 1e6 || fabs(v) < 1e-3)) { snprintf(out, cap, "%.2g", v); return; }
    int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    if (dec > 6) dec = 6;
    snprintf(out, cap, "%.*f", dec, v);
}

static void text_at(cairo_t *cr, double x, double y, const char *s, double ax, double ay) {
    cairo_text_extents_t e;
    cairo_text_extents(cr, s, &e);
    cairo_move_to(cr, x - ax * e.width - e.x_bearing, y - ay * e.height - e.y_bearing);
    cairo_show_text(cr, s);
}

/* Widest legend label of the panels (13 px sans), so every panel gets the same plot
 * width and the x axes line up. */
static double legend_width(cairo_t *cr, const panel_t *P, int np) {
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, 13);
    double lw = 0;
    for (int i = 0; i < np; i++)
        for (int k = 0; k < P[i].ns; k++) {
            cairo_text_extents_t e;
            cairo_text_extents(cr, P[i].s[k].label, &e);
            lw = fmax(lw, e.x_advance);
        }
    return lw;
}

/* Grid, ticks and tick labels of area A. Log axis: 1, 2, 5 x 10^k labelled (every
 * mantissa under half a decade), a light line at each mantissa. */
static void draw_grid(cairo_t *cr, const area_t *A) {
    char lab[64];
    cairo_set_line_width(cr, 1);
    if (A->logy) {
        double span = A->ly1 - A->ly0;
        for (double e = floor(A->ly0); e <= ceil(A->ly1); e += 1)
            for (int m = 1; m <= 9; m++) {
                double v = m * pow(10, e), lv = log10(v);
                if (lv < A->ly0 - 1e-9 || lv > A->ly1 + 1e-9) continue;
                double y = yp(A, v);
                int major = m == 1 || ((m == 2 || m == 5) && span <= 2) || span < 0.5;
                double g = m == 1 ? 0.82 : major ? 0.88 : 0.94;
                cairo_set_source_rgb(cr, g, g, g);
                cairo_move_to(cr, A->px, y); cairo_line_to(cr, A->px + A->pw, y); cairo_stroke(cr);
                if (!major) continue;
                cairo_set_source_rgb(cr, 0, 0, 0);
                snprintf(lab, sizeof lab, "%g", v);
                text_at(cr, A->px - 8, y, lab, 1, 0.5);
                cairo_move_to(cr, A->px - 5, y); cairo_line_to(cr, A->px, y); cairo_stroke(cr);
            }
    } else {
        double st = nice_step(A->ly1 - A->ly0, 5);
        for (double v = A->ly0; v <= A->ly1 + st * 1e-6; v += st) {
            double y = yp(A, v);
            cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
            cairo_move_to(cr, A->px, y); cairo_line_to(cr, A->px + A->pw, y); cairo_stroke(cr);
            cairo_set_source_rgb(cr, 0, 0, 0);
            fmt_tick(fabs(v) < st * 1e-9 ? 0 : v, st, lab, sizeof lab);
            text_at(cr, A->px - 8, y, lab, 1, 0.5);
            cairo_move_to(cr, A->px - 5, y); cairo_line_to(cr, A->px, y); cairo_stroke(cr);
        }
    }
    double xst = nice_step(A->xmax - A->xmin, 8);
    for (double x = ceil(A->xmin / xst) * xst; x <= A->xmax + xst * 1e-6; x += xst) {
        double X = xp(A, x);
        cairo_set_source_rgb(cr, 0.92, 0.92, 0.92);
        cairo_move_to(cr, X, A->py); cairo_line_to(cr, X, A->py + A->ph); cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        cairo_move_to(cr, X, A->py + A->ph); cairo_line_to(cr, X, A->py + A->ph + 5); cairo_stroke(cr);
        fmt_tick(x, xst, lab, sizeof lab);
        text_at(cr, X, A->py + A->ph + 9, lab, 0.5, 0);
    }
}

/* The events as dashed vertical lines (inside the clip); labels, rotated, when asked. */
static void draw_marks(cairo_t *cr, const panel_t *p, const area_t *A) {
    static const double col[][3] = {{0.55, 0.10, 0.55}, {0.80, 0.50, 0.00}, {0.80, 0.10, 0.10},
                                     {0.10, 0.45, 0.80}, {0.20, 0.55, 0.20},
                                     {0.45, 0.45, 0.45}};   /* by mon_mark_kind_t */
    const double dash[] = {5, 4};
    cairo_set_font_size(cr, 11);
    for (int i = 0; i < p->nm; i++) {
        const mon_plot_mark_t *m = &p->marks[i];
        if (m->step < A->xmin || m->step > A->xmax) continue;
        int k = (int)m->kind < 6 ? (int)m->kind : 0;
        double X = xp(A, m->step);
        cairo_set_source_rgb(cr, col[k][0], col[k][1], col[k][2]);
        cairo_set_line_width(cr, 1.2);
        cairo_set_dash(cr, dash, 2, 0);
        cairo_move_to(cr, X, A->py); cairo_line_to(cr, X, A->py + A->ph); cairo_stroke(cr);
        cairo_set_dash(cr, NULL, 0, 0);
        if (!p->label_marks) continue;
        cairo_save(cr);
        cairo_translate(cr, X + 3, A->py + 4);
        cairo_rotate(cr, M_PI / 2);
        text_at(cr, 0, 0, m->label, 0, 1);
        cairo_restore(cr);
    }
    cairo_set_font_size(cr, 13);
}

/* The y range of panel p over points [0, n) into A (ly0, ly1, logy); 0, or -1: no data. */
static int y_range(const panel_t *p, int n, area_t *A) {
    double ymin = INFINITY, ymax = -INFINITY;
    if (isfinite(p->ylo) && isfinite(p->yhi)) ymin = p->ylo, ymax = p->yhi;
    else
        for (int i = 0; i < n; i++)
            for (int k = 0; k < p->ns; k++) {
                double v = p->s[k].y[i];
                if (!isfinite(v) || (p->logy && v <= 0)) continue;
                ymin = fmin(ymin, v);
                ymax = fmax(ymax, v);
            }
    if (!(ymax >= ymin) || n == 0) return -1;
    A->logy = p->logy;
    if (A->logy) {              /* the data's own range, 4% of margin, at least a tenth of a decade */
        double l0 = log10(ymin), l1 = log10(ymax), pad = fmax(0.04 * (l1 - l0), 0.05);
        A->ly0 = l0 - pad;
        A->ly1 = l1 + pad;
    } else {
        if (ymax <= ymin) { double d = fabs(ymax) > 0 ? fabs(ymax) * 0.1 : 1; ymin -= d; ymax += d; }
        double st = nice_step(ymax - ymin, 5);
        A->ly0 = floor(ymin / st) * st;
        A->ly1 = ceil(ymax / st) * st;
    }
    return 0;
}

/* lw: legend label width; the legend sits right of the plot area, never on the data. */
static void draw_panel(cairo_t *cr, const panel_t *p, const double *xs, int n, double x0, double y0,
                       double w, double h, double lw) {
    const double ml = 90, mr = lw + 64, mt = 36, mb = 52;
    area_t A = {x0 + ml, y0 + mt, w - ml - mr, h - mt - mb, INFINITY, -INFINITY, 0, 1, 0};
    for (int i = 0; i < n; i++) A.xmin = fmin(A.xmin, xs[i]), A.xmax = fmax(A.xmax, xs[i]);
    /* title and frame */
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_set_font_size(cr, 17);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
    text_at(cr, A.px + A.pw / 2, y0 + 10, p->title, 0.5, 0);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, 13);
    if (y_range(p, n, &A) < 0) {
        text_at(cr, A.px + A.pw / 2, A.py + A.ph / 2, "no data", 0.5, 0.5);
        return;
    }
    if (A.xmax <= A.xmin) { A.xmin -= 1; A.xmax += 1; }
    draw_grid(cr, &A);
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_set_line_width(cr, 1.2);
    cairo_rectangle(cr, A.px, A.py, A.pw, A.ph);
    cairo_stroke(cr);
    text_at(cr, A.px + A.pw / 2, A.py + A.ph + 30, "step", 0.5, 0);
    cairo_save(cr);
    cairo_translate(cr, x0 + 18, A.py + A.ph / 2);
    cairo_rotate(cr, -M_PI / 2);
    text_at(cr, 0, 0, p->ylabel, 0.5, 0.5);
    cairo_restore(cr);
    /* events and series, clipped to the plot area */
    cairo_save(cr);
    cairo_rectangle(cr, A.px, A.py, A.pw, A.ph);
    cairo_clip(cr);
    draw_marks(cr, p, &A);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    for (int k = 0; k < p->ns; k++) {
        const series_t *s = &p->s[k];
        cairo_set_source_rgb(cr, s->r, s->g, s->b);
        cairo_set_line_width(cr, s->width);
        int pen = 0, pts = 0;
        for (int i = 0; i < n; i++) {
            double v = s->y[i];
            if (!isfinite(v) || (A.logy && v <= 0)) { pen = 0; continue; }
            if (pen) cairo_line_to(cr, xp(&A, xs[i]), yp(&A, v));
            else cairo_move_to(cr, xp(&A, xs[i]), yp(&A, v));
            pen = 1;
            pts++;
        }
        if (pts == 1) {             /* a lone point: a dot */
            for (int i = 0; i < n; i++)
                if (isfinite(s->y[i])) { cairo_arc(cr, xp(&A, xs[i]), yp(&A, s->y[i]), 2.5, 0, 2 * M_PI); cairo_fill(cr); }
        }
        cairo_stroke(cr);
    }
    cairo_restore(cr);
    /* legend, right of the plot area */
    double bx = A.px + A.pw + 12, by = A.py, bh = 20.0 * p->ns + 8;
    cairo_set_source_rgba(cr, 1, 1, 1, 0.85);
    cairo_rectangle(cr, bx, by, lw + 42, bh);
    cairo_fill_preserve(cr);
    cairo_set_source_rgb(cr, 0.6, 0.6, 0.6);
    cairo_set_line_width(cr, 1);
    cairo_stroke(cr);
    for (int k = 0; k < p->ns; k++) {
        const series_t *s = &p->s[k];
        double y = by + 14 + 20.0 * k;
        cairo_set_source_rgb(cr, s->r, s->g, s->b);
        cairo_set_line_width(cr, s->width < 2 ? 2 : s->width);
        cairo_move_to(cr, bx + 6, y); cairo_line_to(cr, bx + 30, y); cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        text_at(cr, bx + 36, y, s->label, 0, 0.5);
    }
}

/* Debiased EMA (zero start divided by 1 - a^k, as Adam's moments and TensorBoard's
 * smoothing) of y[from..n), NaN before from, so the first points are not pulled towards
 * the first value and the warm-up's outliers are not in it. */
static void ema_of(const double *y, double *out, int n, double a, int from) {
    double m = 0, ak = 1;
    for (int i = 0; i < n; i++) {
        if (i < from || !isfinite(y[i])) { out[i] = NAN; continue; }
        m = a * m + (1 - a) * y[i];
        ak *= a;
        out[i] = m / (1 - ak);
    }
}

void mon_plot_cols_free(mon_plot_cols_t *c) {
    free(c->buf_);
    memset(c, 0, sizeof *c);
}

int mon_plot_cols(const mon_run_t *run, double ema, mon_plot_cols_t *c) {
    memset(c, 0, sizeof *c);
    int n = 0;
    for (uint64_t i = 0; i < run->n_steps; i++) n += run->steps[i].have != 0;
    if (n == 0) return dl_seterr(DL_ENOENT, "no applied step in %s (steps.jsonl / metrics.jsonl)",
                                 run->dir[0] ? run->dir : "the run");
    enum { NCOL = 10 };
    c->buf_ = malloc(sizeof(double) * (size_t)n * NCOL);
    if (!c->buf_) return dl_seterr(DL_ENOMEM, "plot: out of memory");
    double *col[NCOL];
    for (int k = 0; k < NCOL; k++) col[k] = c->buf_ + (size_t)k * (size_t)n;
    c->n = n;
    c->x = col[0], c->loss = col[1], c->loss_ema = col[2], c->tps = col[3], c->tps_ema = col[4];
    c->accm = col[5];
    for (int k = 0; k < 4; k++) c->acc[k] = col[6 + k];
    for (uint64_t i = 0; i < run->n_steps; i++)
        if (run->steps[i].have && run->steps[i].n_acc - 1 > c->last_pos) c->last_pos = run->steps[i].n_acc - 1;
    const mon_step_t **st = malloc(sizeof *st * (size_t)n);
    if (!st) { mon_plot_cols_free(c); return dl_seterr(DL_ENOMEM, "plot: out of memory"); }
    int j = 0;
    for (uint64_t i = 0; i < run->n_steps; i++) if (run->steps[i].have) st[j++] = &run->steps[i];
    int w = n / 60 > 1 ? n / 60 : 1;    /* steps per throughput window */
    for (j = 0; j < n; j++) {
        const mon_step_t *s = st[j];
        c->x[j] = (double)s->step;      /* as steps.jsonl and the progress line name steps */
        c->loss[j] = s->loss;
        c->accm[j] = s->acc_mean;
        for (int k = 0; k < 3; k++) c->acc[k][j] = s->acc[k + 1];
        c->acc[3][j] = c->last_pos > 3 ? s->acc[c->last_pos] : NAN;
        /* the tokens of the w steps ending here over their time: only a complete window
         * of consecutive steps (none across a restart or a gap) is a rate */
        double r = NAN;
        const mon_step_t *b = j >= w ? st[j - w] : NULL;
        if (b && b->step + (uint64_t)w == s->step) {
            double dt = isfinite(s->t) && isfinite(b->t) ? s->t - b->t : s->ts - b->ts;
            if (dt > 0 && isfinite(s->tokens) && isfinite(b->tokens) && s->tokens >= b->tokens)
                r = (s->tokens - b->tokens) / dt;
        }
        c->tps[j] = r;
    }
    /* the last step's interval holds the final checkpoint write (the optimizer saves it
     * before it publishes the step): not a rate of training */
    if (n > 1) c->tps[n - 1] = NAN;
    free(st);
    c->warm = n / 20 + 1 < 50 ? n / 20 + 1 : 50;
    if (c->warm >= n) c->warm = 0;      /* too few points for a warm-up */
    ema_of(c->loss, c->loss_ema, n, ema, c->warm);
    ema_of(c->tps, c->tps_ema, n, ema, 0);
    return 0;
}

/* The loss panel: log or linear axis over the range after the warm-up. */
static void loss_panel(panel_t *P, const mon_plot_cols_t *c, mon_plot_loss_scale_t scale, char *ylabel,
                       size_t cap) {
    double lo = INFINITY, hi = -INFINITY;
    for (int i = c->warm; i < c->n; i++)
        for (int k = 0; k < 2; k++) {
            double v = k ? c->loss_ema[i] : c->loss[i];
            if (isfinite(v) && v > 0) lo = fmin(lo, v), hi = fmax(hi, v);
        }
    int logy = scale == MON_PLOT_LOSS_LOG || (scale == MON_PLOT_LOSS_AUTO && hi / lo > 2);
    if (!(hi >= lo)) logy = 0, lo = hi = NAN;   /* no positive loss: the series' own range */
    P->logy = logy;
    P->ylo = lo, P->yhi = hi;
    if (c->warm) snprintf(ylabel, cap, "loss%s (steps %.0f-%.0f may lie above)", logy ? ", log scale" : "",
                          c->x[0], c->x[c->warm - 1]);
    else snprintf(ylabel, cap, "loss%s", logy ? " (log scale)" : "");
    P->ylabel = ylabel;
}

int mon_plot_png(const mon_run_t *run, const char *path, const mon_plot_opts_t *o) {
    mon_plot_opts_t d = {1200, 1350, NULL, 0, MON_PLOT_LOSS_AUTO};
    if (o) {
        if (o->width) d.width = o->width;
        if (o->height) d.height = o->height;
        d.title = o->title;
        if (o->ema > 0 && o->ema < 1) d.ema = o->ema;
        d.loss_scale = o->loss_scale;
    }
    if (d.width < 300 || d.height < 300 || d.width > 10000 || d.height > 10000)
        return dl_seterr(DL_EINVAL, "size %dx%d out of range (300..10000)", d.width, d.height);
    int n = 0;
    for (uint64_t i = 0; i < run->n_steps; i++) n += run->steps[i].have != 0;
    if (!(d.ema > 0 && d.ema < 1))              /* about n/5 points of memory, within [0.5, 0.95] */
        d.ema = fmin(0.95, fmax(0.5, 1 - 5.0 / (n > 0 ? n : 1)));
    mon_plot_cols_t c;
    DL_TRY(mon_plot_cols(run, d.ema, &c));
    mon_plot_mark_t marks[MON_PLOT_MAX_MARKS];
    int nm = mon_plot_events(run, marks);
    char ema_lab[64], last_lab[32], loss_lab[96];
    snprintf(ema_lab, sizeof ema_lab, "EMA %.2g", d.ema);
    snprintf(last_lab, sizeof last_lab, "position %d", c.last_pos);
    panel_t P[3];
    memset(P, 0, sizeof P);
    for (int k = 0; k < 3; k++) P[k].ylo = P[k].yhi = NAN, P[k].marks = marks, P[k].nm = nm;
    P[0].label_marks = 1;
    P[0].title = "Loss";
    loss_panel(&P[0], &c, d.loss_scale, loss_lab, sizeof loss_lab);
    P[0].s[P[0].ns++] = (series_t){"per step", 0.62, 0.75, 0.92, 1.2, c.loss};
    P[0].s[P[0].ns++] = (series_t){ema_lab, 0.08, 0.25, 0.65, 2.6, c.loss_ema};
    P[1].title = "Top-1 accuracy of the drafter's block positions";
    P[1].ylabel = "accuracy";
    P[1].s[P[1].ns++] = (series_t){"mean over positions", 0.05, 0.05, 0.05, 2.6, c.accm};
    if (c.last_pos >= 1) P[1].s[P[1].ns++] = (series_t){"position 1", 0.85, 0.33, 0.10, 1.6, c.acc[0]};
    if (c.last_pos >= 2) P[1].s[P[1].ns++] = (series_t){"position 2", 0.20, 0.60, 0.25, 1.6, c.acc[1]};
    if (c.last_pos >= 3) P[1].s[P[1].ns++] = (series_t){"position 3", 0.45, 0.30, 0.70, 1.6, c.acc[2]};
    if (c.last_pos > 3) P[1].s[P[1].ns++] = (series_t){last_lab, 0.55, 0.55, 0.55, 1.6, c.acc[3]};
    P[2].title = "Throughput";
    P[2].ylabel = "target tokens/s";
    P[2].s[P[2].ns++] = (series_t){n / 60 > 1 ? "per window of steps" : "per step", 0.65, 0.85, 0.65, 1.2, c.tps};
    P[2].s[P[2].ns++] = (series_t){ema_lab, 0.05, 0.50, 0.15, 2.6, c.tps_ema};

    cairo_surface_t *surf = cairo_image_surface_create(CAIRO_FORMAT_RGB24, d.width, d.height);
    cairo_t *cr = cairo_create(surf);
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    char title[512];
    if (d.title) snprintf(title, sizeof title, "%s", d.title);
    else snprintf(title, sizeof title, "draftline run %.400s: %d steps", run->dir[0] ? run->dir : "", n);
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
    cairo_set_font_size(cr, 19);
    text_at(cr, d.width / 2.0, 12, title, 0.5, 0);
    double top = 44, ph = (d.height - top) / 3.0;
    double lw = legend_width(cr, P, 3);
    for (int k = 0; k < 3; k++) draw_panel(cr, &P[k], c.x, n, 0, top + k * ph, d.width, ph, lw);
    cairo_status_t cs = cairo_status(cr);
    cairo_destroy(cr);
    int rc = 0;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (cs == CAIRO_STATUS_SUCCESS) cs = cairo_surface_write_to_png(surf, tmp);
    cairo_surface_destroy(surf);
    mon_plot_cols_free(&c);
    if (cs != CAIRO_STATUS_SUCCESS) {
        remove(tmp);
        return dl_seterr(DL_EIO, "cairo: %s (writing %s)", cairo_status_to_string(cs), path);
    }
    if (rename(tmp, path) != 0) {
        remove(tmp);
        rc = dl_seterr(DL_EIO, "rename %s -> %s failed", tmp, path);
    }
    return rc;
}
