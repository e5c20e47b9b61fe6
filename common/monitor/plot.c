/* Training curves to PNG with cairo (see plot.h). */
#include "common/monitor/plot.h"
#include "common/base/err.h"

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
    series_t s[PLOT_MAX_SERIES];
    int ns;
} panel_t;

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

/* lw: legend label width; the legend sits right of the plot area, never on the data. */
static void draw_panel(cairo_t *cr, const panel_t *p, const double *xs, int n, double x0, double y0,
                       double w, double h, double lw) {
    const double ml = 90, mr = lw + 64, mt = 36, mb = 52;
    double px = x0 + ml, py = y0 + mt, pw = w - ml - mr, ph = h - mt - mb;
    /* data ranges */
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    for (int i = 0; i < n; i++) {
        xmin = fmin(xmin, xs[i]);
        xmax = fmax(xmax, xs[i]);
        for (int k = 0; k < p->ns; k++) {
            double v = p->s[k].y[i];
            if (!isfinite(v) || (p->logy && v <= 0)) continue;
            ymin = fmin(ymin, v);
            ymax = fmax(ymax, v);
        }
    }
    /* title and frame */
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_set_font_size(cr, 17);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
    text_at(cr, px + pw / 2, y0 + 10, p->title, 0.5, 0);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, 13);
    if (!(ymax >= ymin) || n == 0) {
        text_at(cr, px + pw / 2, py + ph / 2, "no data", 0.5, 0.5);
        return;
    }
    if (xmax <= xmin) { xmin -= 1; xmax += 1; }
    int logy = p->logy;
    double ly0, ly1;
    if (logy) {
        ly0 = floor(log10(ymin));
        ly1 = ceil(log10(ymax));
        if (ly1 <= ly0) ly1 = ly0 + 1;
    } else {
        if (ymax <= ymin) { double d = fabs(ymax) > 0 ? fabs(ymax) * 0.1 : 1; ymin -= d; ymax += d; }
        double st = nice_step(ymax - ymin, 5);
        ly0 = floor(ymin / st) * st;
        ly1 = ceil(ymax / st) * st;
    }
    double xst = nice_step(xmax - xmin, 8);
#define XP(x) (px + ((x) - xmin) / (xmax - xmin) * pw)
#define YP(v) (py + ph - ((logy ? log10(v) : (v)) - ly0) / (ly1 - ly0) * ph)
    /* grid and ticks */
    cairo_set_line_width(cr, 1);
    char lab[64];
    if (logy) {
        for (double e = ly0; e <= ly1 + 1e-9; e += 1) {
            for (int m = 1; m <= 9; m++) {
                double v = m * pow(10, e);
                if (log10(v) > ly1 + 1e-9) break;
                double y = YP(v);
                cairo_set_source_rgb(cr, m == 1 ? 0.82 : 0.93, m == 1 ? 0.82 : 0.93, m == 1 ? 0.82 : 0.93);
                cairo_move_to(cr, px, y); cairo_line_to(cr, px + pw, y); cairo_stroke(cr);
                if (m == 1 || ((m == 2 || m == 5) && ly1 - ly0 <= 2)) {
                    cairo_set_source_rgb(cr, 0, 0, 0);
                    snprintf(lab, sizeof lab, "%g", v);
                    text_at(cr, px - 8, y, lab, 1, 0.5);
                    cairo_move_to(cr, px - 5, y); cairo_line_to(cr, px, y); cairo_stroke(cr);
                }
            }
        }
    } else {
        double st = nice_step(ly1 - ly0, 5);
        for (double v = ly0; v <= ly1 + st * 1e-6; v += st) {
            double y = YP(v);
            cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
            cairo_move_to(cr, px, y); cairo_line_to(cr, px + pw, y); cairo_stroke(cr);
            cairo_set_source_rgb(cr, 0, 0, 0);
            fmt_tick(fabs(v) < st * 1e-9 ? 0 : v, st, lab, sizeof lab);
            text_at(cr, px - 8, y, lab, 1, 0.5);
            cairo_move_to(cr, px - 5, y); cairo_line_to(cr, px, y); cairo_stroke(cr);
        }
    }
    for (double x = ceil(xmin / xst) * xst; x <= xmax + xst * 1e-6; x += xst) {
        double X = XP(x);
        cairo_set_source_rgb(cr, 0.92, 0.92, 0.92);
        cairo_move_to(cr, X, py); cairo_line_to(cr, X, py + ph); cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        cairo_move_to(cr, X, py + ph); cairo_line_to(cr, X, py + ph + 5); cairo_stroke(cr);
        fmt_tick(x, xst, lab, sizeof lab);
        text_at(cr, X, py + ph + 9, lab, 0.5, 0);
    }
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_set_line_width(cr, 1.2);
    cairo_rectangle(cr, px, py, pw, ph);
    cairo_stroke(cr);
    text_at(cr, px + pw / 2, py + ph + 30, "step", 0.5, 0);
    cairo_save(cr);
    cairo_translate(cr, x0 + 18, py + ph / 2);
    cairo_rotate(cr, -M_PI / 2);
    text_at(cr, 0, 0, p->ylabel, 0.5, 0.5);
    cairo_restore(cr);
    /* series, clipped to the plot area */
    cairo_save(cr);
    cairo_rectangle(cr, px, py, pw, ph);
    cairo_clip(cr);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    for (int k = 0; k < p->ns; k++) {
        const series_t *s = &p->s[k];
        cairo_set_source_rgb(cr, s->r, s->g, s->b);
        cairo_set_line_width(cr, s->width);
        int pen = 0, pts = 0;
        for (int i = 0; i < n; i++) {
            double v = s->y[i];
            if (!isfinite(v) || (logy && v <= 0)) { pen = 0; continue; }
            if (pen) cairo_line_to(cr, XP(xs[i]), YP(v));
            else cairo_move_to(cr, XP(xs[i]), YP(v));
            pen = 1;
            pts++;
        }
        if (pts == 1) {             /* a lone point: a dot */
            for (int i = 0; i < n; i++)
                if (isfinite(s->y[i])) { cairo_arc(cr, XP(xs[i]), YP(s->y[i]), 2.5, 0, 2 * M_PI); cairo_fill(cr); }
        }
        cairo_stroke(cr);
    }
    cairo_restore(cr);
    /* legend, right of the plot area */
    double bx = px + pw + 12, by = py, bh = 20.0 * p->ns + 8;
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
#undef XP
#undef YP
}

/* Debiased EMA (zero start divided by 1 - a^k, as Adam's moments and TensorBoard's
 * smoothing), so the first points are not pulled towards the first value. */
static void ema_of(const double *y, double *out, int n, double a) {
    double m = 0, ak = 1;
    for (int i = 0; i < n; i++) {
        if (!isfinite(y[i])) { out[i] = NAN; continue; }
        m = a * m + (1 - a) * y[i];
        ak *= a;
        out[i] = m / (1 - ak);
    }
}

int mon_plot_png(const mon_run_t *run, const char *path, const mon_plot_opts_t *o) {
    mon_plot_opts_t d = {1200, 1350, NULL, 0};
    if (o) {
        if (o->width) d.width = o->width;
        if (o->height) d.height = o->height;
        d.title = o->title;
        if (o->ema > 0 && o->ema < 1) d.ema = o->ema;
    }
    if (d.width < 300 || d.height < 300 || d.width > 10000 || d.height > 10000)
        return dl_seterr(DL_EINVAL, "size %dx%d out of range (300..10000)", d.width, d.height);
    int n = 0;
    for (uint64_t i = 0; i < run->n_steps; i++) n += run->steps[i].have != 0;
    if (n == 0) return dl_seterr(DL_ENOENT, "no applied step in %s (steps.jsonl / metrics.jsonl)",
                                 run->dir[0] ? run->dir : "the run");
    if (!(d.ema > 0 && d.ema < 1))              /* about n/5 points of memory, within [0.5, 0.95] */
        d.ema = fmin(0.95, fmax(0.5, 1 - 5.0 / n));
    enum { X, LOSS, LOSS_E, ACCM, A1, A2, A3, AL, TPS, TPS_E, NCOL };
    double *buf = malloc(sizeof(double) * (size_t)n * NCOL);
    if (!buf) return dl_seterr(DL_ENOMEM, "plot image: out of memory");
    double *col[NCOL];
    for (int c = 0; c < NCOL; c++) col[c] = buf + (size_t)c * (size_t)n;
    int last_pos = 0;
    for (uint64_t i = 0; i < run->n_steps; i++)
        if (run->steps[i].have && run->steps[i].n_acc - 1 > last_pos) last_pos = run->steps[i].n_acc - 1;
    int j = 0;
    const mon_step_t *prev = NULL;
    for (uint64_t i = 0; i < run->n_steps; i++) {
        const mon_step_t *s = &run->steps[i];
        if (!s->have) continue;
        col[X][j] = (double)s->step + 1;       /* steps counted from 1, as the progress line */
        col[LOSS][j] = s->loss;
        col[ACCM][j] = s->acc_mean;
        col[A1][j] = s->acc[1];
        col[A2][j] = s->acc[2];
        col[A3][j] = s->acc[3];
        col[AL][j] = last_pos > 3 ? s->acc[last_pos] : NAN;
        double r = NAN;
        if (prev && prev->step + 1 == s->step) {
            double dt = isfinite(s->t) && isfinite(prev->t) ? s->t - prev->t : s->ts - prev->ts;
            if (dt > 0 && isfinite(s->tokens) && isfinite(prev->tokens) && s->tokens >= prev->tokens)
                r = (s->tokens - prev->tokens) / dt;
        }
        col[TPS][j] = r;
        prev = s;
        j++;
    }
    ema_of(col[LOSS], col[LOSS_E], n, d.ema);
    ema_of(col[TPS], col[TPS_E], n, d.ema);
    double lmin = INFINITY, lmax = -INFINITY;
    for (int i = 0; i < n; i++)
        if (isfinite(col[LOSS][i]) && col[LOSS][i] > 0) { lmin = fmin(lmin, col[LOSS][i]); lmax = fmax(lmax, col[LOSS][i]); }
    char ema_lab[64], last_lab[32];
    snprintf(ema_lab, sizeof ema_lab, "EMA %.2g", d.ema);
    snprintf(last_lab, sizeof last_lab, "position %d", last_pos);
    panel_t P[3];
    memset(P, 0, sizeof P);
    P[0].title = "Loss";
    P[0].ylabel = lmax / lmin > 20 ? "loss (log scale)" : "loss";
    P[0].logy = lmax / lmin > 20;
    P[0].s[P[0].ns++] = (series_t){"per step", 0.62, 0.75, 0.92, 1.2, col[LOSS]};
    P[0].s[P[0].ns++] = (series_t){ema_lab, 0.08, 0.25, 0.65, 2.6, col[LOSS_E]};
    P[1].title = "Top-1 accuracy of the drafter's block positions";
    P[1].ylabel = "accuracy";
    P[1].s[P[1].ns++] = (series_t){"mean over positions", 0.05, 0.05, 0.05, 2.6, col[ACCM]};
    if (last_pos >= 1) P[1].s[P[1].ns++] = (series_t){"position 1", 0.85, 0.33, 0.10, 1.6, col[A1]};
    if (last_pos >= 2) P[1].s[P[1].ns++] = (series_t){"position 2", 0.20, 0.60, 0.25, 1.6, col[A2]};
    if (last_pos >= 3) P[1].s[P[1].ns++] = (series_t){"position 3", 0.45, 0.30, 0.70, 1.6, col[A3]};
    if (last_pos > 3) P[1].s[P[1].ns++] = (series_t){last_lab, 0.55, 0.55, 0.55, 1.6, col[AL]};
    P[2].title = "Throughput";
    P[2].ylabel = "target tokens/s";
    P[2].s[P[2].ns++] = (series_t){"per step", 0.65, 0.85, 0.65, 1.2, col[TPS]};
    P[2].s[P[2].ns++] = (series_t){ema_lab, 0.05, 0.50, 0.15, 2.6, col[TPS_E]};

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
    for (int k = 0; k < 3; k++) draw_panel(cr, &P[k], col[X], n, 0, top + k * ph, d.width, ph, lw);
    cairo_status_t cs = cairo_status(cr);
    cairo_destroy(cr);
    int rc = 0;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (cs == CAIRO_STATUS_SUCCESS) cs = cairo_surface_write_to_png(surf, tmp);
    cairo_surface_destroy(surf);
    free(buf);
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
