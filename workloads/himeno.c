/* himeno: Himeno-like 3D 19-point Jacobi stencil (the Himeno benchmark of DLM Fig. 7): the
 * pressure grid p, the coefficient grids a0..a3, b0..b2, c0..c2, bnd, wrk1, and the output
 * wrk2, fourteen float grids of I x J x K cells with K = 2I = 2J, SIZE MiB in all. Second
 * argument: Jacobi iterations (default 3). Coefficients are near Himeno's constants but
 * perturbed so the data does not compress.
 * Self-check: after the first iteration, sampled cells are recomputed on a 3x3x3 grid
 * filled independently from the same hash (the same sweep code, so bit for bit); at the end,
 * every coefficient cell is compared with its generated value, and the residual is finite. */
#include <math.h>
#include "wl.h"

enum { P, A0, A1, A2, A3, B0, B1, B2, C0, C1, C2, BND, WRK1, WRK2, GRIDS };

struct grid {
    size_t ni, nj, nk;
    float *g[GRIDS];
};

static size_t at(const struct grid *g, size_t i, size_t j, size_t k) {
    return (i * g->nj + j) * g->nk + k;
}

/* The initial value of grid `which` at the global cell number `cell`. */
static float initial(int which, uint64_t cell) {
    float u = (float)(wl_hash_double((uint64_t)which << 56 ^ cell) - 1.5); /* [-0.5, 0.5) */
    switch (which) {
    case P:
        return u + 0.5f;
    case A0: case A1: case A2: case C0: case C1: case C2: case BND:
        return 1.0f + 0.01f * u;
    case A3:
        return 1.0f / 6.0f + 0.001f * u;
    case WRK2:
        return 0.0f;
    default: /* B0..B2, WRK1 */
        return 0.01f * u;
    }
}

static void init_cell(struct grid *g, size_t local, uint64_t global) {
    for (int w = 0; w < GRIDS; w++)
        g->g[w][local] = initial(w, global);
}

static double sweep(struct grid *g, float omega) {
    float **x = g->g, *p = x[P];
    size_t di = g->nj * g->nk, dj = g->nk;
    double gosa = 0;
    for (size_t i = 1; i + 1 < g->ni; i++)
        for (size_t j = 1; j + 1 < g->nj; j++)
            for (size_t k = 1; k + 1 < g->nk; k++) {
                size_t c = at(g, i, j, k);
                float s0 = x[A0][c] * p[c + di] + x[A1][c] * p[c + dj] + x[A2][c] * p[c + 1] +
                           x[B0][c] * (p[c + di + dj] - p[c + di - dj] - p[c - di + dj] +
                                       p[c - di - dj]) +
                           x[B1][c] * (p[c + dj + 1] - p[c - dj + 1] - p[c + dj - 1] +
                                       p[c - dj - 1]) +
                           x[B2][c] * (p[c + di + 1] - p[c - di + 1] - p[c + di - 1] +
                                       p[c - di - 1]) +
                           x[C0][c] * p[c - di] + x[C1][c] * p[c - dj] + x[C2][c] * p[c - 1] +
                           x[WRK1][c];
                float ss = (s0 * x[A3][c] - p[c]) * x[BND][c];
                gosa += (double)(ss * ss);
                x[WRK2][c] = p[c] + omega * ss;
            }
    for (size_t i = 1; i + 1 < g->ni; i++)
        for (size_t j = 1; j + 1 < g->nj; j++)
            for (size_t k = 1; k + 1 < g->nk; k++)
                p[at(g, i, j, k)] = x[WRK2][at(g, i, j, k)];
    return gosa;
}

static const float omega = 0.8f;

/* Recompute cell (i, j, k) of the first iteration on its own 3x3x3 neighbourhood. */
static float expected_first(const struct grid *big, size_t i, size_t j, size_t k) {
    float cells[GRIDS][27];
    struct grid g = {3, 3, 3, {0}};
    for (int w = 0; w < GRIDS; w++)
        g.g[w] = cells[w];
    for (size_t li = 0; li < 3; li++)
        for (size_t lj = 0; lj < 3; lj++)
            for (size_t lk = 0; lk < 3; lk++)
                init_cell(&g, at(&g, li, lj, lk), at(big, i + li - 1, j + lj - 1, k + lk - 1));
    sweep(&g, omega);
    return g.g[P][at(&g, 1, 1, 1)];
}

int main(int argc, char **argv) {
    uint64_t iters = 3;
    size_t size = wl_args("himeno", argc, argv, &iters);
    size_t cells = size / (GRIDS * sizeof(float));
    size_t n = (size_t)cbrt((double)cells / 2.0);
    if (n < 3 || iters == 0)
        wl_fail("size too small (or no iterations)");
    struct grid g = {n, n, 2 * n, {0}};
    cells = g.ni * g.nj * g.nk;
    for (int w = 0; w < GRIDS; w++)
        g.g[w] = wl_alloc(cells * sizeof(float));

    double t0 = wl_now();
    for (size_t c = 0; c < cells; c++)
        init_cell(&g, c, c);
    double gosa = 0;
    uint64_t s = 12345;
    for (uint64_t it = 0; it < iters; it++) {
        gosa = sweep(&g, omega);
        for (int probe = 0; it == 0 && probe < 256; probe++) {
            size_t i = 1 + wl_rand(&s) % (g.ni - 2), j = 1 + wl_rand(&s) % (g.nj - 2),
                   k = 1 + wl_rand(&s) % (g.nk - 2);
            float want = expected_first(&g, i, j, k), got = g.g[P][at(&g, i, j, k)];
            if (got != want)
                wl_fail("first iteration, cell (%zu,%zu,%zu): %g, expected %g", i, j, k, got,
                        want);
        }
    }
    double secs = wl_now() - t0;

    if (!isfinite(gosa) || gosa <= 0)
        wl_fail("residual %g is not a positive number", gosa);
    for (int w = A0; w <= WRK1; w++)
        for (size_t c = 0; c < cells; c++)
            if (g.g[w][c] != initial(w, c))
                wl_fail("coefficient grid %d, cell %zu: %g, expected %g", w, c, g.g[w][c],
                        initial(w, c));
    uint64_t check = wl_fold(wl_bits(gosa), cells);
    wl_ok(secs, check);
    for (int w = 0; w < GRIDS; w++)
        wl_free(g.g[w]);
    return 0;
}
