/* Himeno benchmark (R. Himeno, RIKEN; the published dynamic-allocation version, himenoBMTxpa),
 * written here from its published description for `rmem bench programs`: the Poisson
 * equation for pressure solved by Jacobi iteration with a 19-point stencil, fourteen float
 * grids (p, a[4], b[3], c[3], bnd, wrk1, wrk2) of MIMAX x MJMAX x MKMAX cells, initialised as
 * the benchmark does (a = 1, 1, 1, 1/6; b = 0; c = 1; bnd = 1; wrk1 = 0;
 * p = k^2 / (kmax - 1)^2), omega = 0.8, 34 floating-point operations per cell.
 * The published program calibrates its iteration count to a minute; here the count is an
 * argument, so that the output (the residual gosa) is the same from run to run.
 *
 * Usage: himeno SIZE [ITERATIONS]   SIZE: XS, S, M, L, XL (the benchmark's grids) or IxJxK
 * Standard output: grid, iterations, gosa. Standard error: MFLOPS. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct mat {
    float *m;
    int mnums, mrows, mcols, mdeps;
};

#define MR(mt, n, r, c, d)                                                                    \
    mt->m[(size_t)(n) * mt->mrows * mt->mcols * mt->mdeps + (size_t)(r) * mt->mcols * mt->mdeps \
          + (size_t)(c) * mt->mdeps + (d)]

static int newmat(struct mat *mt, int mnums, int mrows, int mcols, int mdeps) {
    mt->mnums = mnums;
    mt->mrows = mrows;
    mt->mcols = mcols;
    mt->mdeps = mdeps;
    mt->m = malloc((size_t)mnums * mrows * mcols * mdeps * sizeof(float));
    return mt->m != NULL;
}

static void mat_set(struct mat *mt, int l, float v) {
    for (int i = 0; i < mt->mrows; i++)
        for (int j = 0; j < mt->mcols; j++)
            for (int k = 0; k < mt->mdeps; k++)
                MR(mt, l, i, j, k) = v;
}

static void mat_set_init(struct mat *mt) {
    for (int i = 0; i < mt->mrows; i++)
        for (int j = 0; j < mt->mcols; j++)
            for (int k = 0; k < mt->mdeps; k++)
                MR(mt, 0, i, j, k) = (float)(k * k) / (float)((mt->mdeps - 1) * (mt->mdeps - 1));
}

static float jacobi(int nn, struct mat *a, struct mat *b, struct mat *c, struct mat *p,
                    struct mat *bnd, struct mat *wrk1, struct mat *wrk2) {
    const float omega = 0.8f;
    int imax = p->mrows - 1, jmax = p->mcols - 1, kmax = p->mdeps - 1;
    float gosa = 0.0f;
    for (int n = 0; n < nn; n++) {
        gosa = 0.0f;
        for (int i = 1; i < imax; i++)
            for (int j = 1; j < jmax; j++)
                for (int k = 1; k < kmax; k++) {
                    float s0 = MR(a, 0, i, j, k) * MR(p, 0, i + 1, j, k)
                             + MR(a, 1, i, j, k) * MR(p, 0, i, j + 1, k)
                             + MR(a, 2, i, j, k) * MR(p, 0, i, j, k + 1)
                             + MR(b, 0, i, j, k) * (MR(p, 0, i + 1, j + 1, k) - MR(p, 0, i + 1, j - 1, k)
                                                    - MR(p, 0, i - 1, j + 1, k) + MR(p, 0, i - 1, j - 1, k))
                             + MR(b, 1, i, j, k) * (MR(p, 0, i, j + 1, k + 1) - MR(p, 0, i, j - 1, k + 1)
                                                    - MR(p, 0, i, j + 1, k - 1) + MR(p, 0, i, j - 1, k - 1))
                             + MR(b, 2, i, j, k) * (MR(p, 0, i + 1, j, k + 1) - MR(p, 0, i - 1, j, k + 1)
                                                    - MR(p, 0, i + 1, j, k - 1) + MR(p, 0, i - 1, j, k - 1))
                             + MR(c, 0, i, j, k) * MR(p, 0, i - 1, j, k)
                             + MR(c, 1, i, j, k) * MR(p, 0, i, j - 1, k)
                             + MR(c, 2, i, j, k) * MR(p, 0, i, j, k - 1)
                             + MR(wrk1, 0, i, j, k);
                    float ss = (s0 * MR(a, 3, i, j, k) - MR(p, 0, i, j, k)) * MR(bnd, 0, i, j, k);
                    gosa += ss * ss;
                    MR(wrk2, 0, i, j, k) = MR(p, 0, i, j, k) + omega * ss;
                }
        for (int i = 1; i < imax; i++)
            for (int j = 1; j < jmax; j++)
                for (int k = 1; k < kmax; k++)
                    MR(p, 0, i, j, k) = MR(wrk2, 0, i, j, k);
    }
    return gosa;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: himeno XS|S|M|L|XL|IxJxK [ITERATIONS]\n");
        return 2;
    }
    int mimax, mjmax, mkmax;
    const char *s = argv[1];
    if (!strcmp(s, "XS")) mimax = 33, mjmax = 33, mkmax = 65;
    else if (!strcmp(s, "S")) mimax = 65, mjmax = 65, mkmax = 129;
    else if (!strcmp(s, "M")) mimax = 129, mjmax = 129, mkmax = 257;
    else if (!strcmp(s, "L")) mimax = 257, mjmax = 257, mkmax = 513;
    else if (!strcmp(s, "XL")) mimax = 513, mjmax = 513, mkmax = 1025;
    else if (sscanf(s, "%dx%dx%d", &mimax, &mjmax, &mkmax) != 3 || mimax < 4 || mjmax < 4 || mkmax < 4) {
        fprintf(stderr, "himeno: bad grid size %s\n", s);
        return 2;
    }
    int nn = argc > 2 ? atoi(argv[2]) : 3;
    struct mat p, bnd, wrk1, wrk2, a, b, c;
    if (!newmat(&p, 1, mimax, mjmax, mkmax) || !newmat(&bnd, 1, mimax, mjmax, mkmax)
        || !newmat(&wrk1, 1, mimax, mjmax, mkmax) || !newmat(&wrk2, 1, mimax, mjmax, mkmax)
        || !newmat(&a, 4, mimax, mjmax, mkmax) || !newmat(&b, 3, mimax, mjmax, mkmax)
        || !newmat(&c, 3, mimax, mjmax, mkmax)) {
        fprintf(stderr, "himeno: cannot allocate the grids\n");
        return 1;
    }
    mat_set_init(&p);
    mat_set(&bnd, 0, 1.0f);
    mat_set(&wrk1, 0, 0.0f);
    mat_set(&wrk2, 0, 0.0f);
    mat_set(&a, 0, 1.0f);
    mat_set(&a, 1, 1.0f);
    mat_set(&a, 2, 1.0f);
    mat_set(&a, 3, 1.0f / 6.0f);
    mat_set(&b, 0, 0.0f);
    mat_set(&b, 1, 0.0f);
    mat_set(&b, 2, 0.0f);
    mat_set(&c, 0, 1.0f);
    mat_set(&c, 1, 1.0f);
    mat_set(&c, 2, 1.0f);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    float gosa = jacobi(nn, &a, &b, &c, &p, &bnd, &wrk1, &wrk2);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    double flop = (double)(mimax - 2) * (mjmax - 2) * (mkmax - 2) * 34.0 * nn;
    printf("Himeno grid %dx%dx%d (%.1f MiB), %d iterations\n", mimax, mjmax, mkmax,
           14.0 * mimax * mjmax * mkmax * sizeof(float) / 1048576, nn);
    printf("gosa %.9e\n", (double)gosa);
    fprintf(stderr, "himeno: %.3f s, %.1f MFLOPS\n", secs, flop / secs * 1e-6);
    return 0;
}
