/* STREAM (J. D. McCalpin, "Memory Bandwidth and Machine Balance in Current High Performance
 * Computers", IEEE TCCA Newsletter 1995; the benchmark's published rules at
 * https://www.cs.virginia.edu/stream/ref.html), written here from that specification for
 * `rmem bench programs`: three double arrays a, b, c of N elements each, malloc'd as a user's
 * build with dynamic arrays does; a = 1, b = 2, c = 0, then a = 2a; NTIMES times Copy
 * (c = a), Scale (b = q c), Add (c = a + b), Triad (a = b + q c) with q = 3; then the
 * published validation: every element against the scalar replay of the same operations,
 * average absolute error within 1e-13 relative.
 *
 * Usage: stream MIB [NTIMES]   (MIB: the three arrays together; NTIMES default 10)
 * Standard output: the array size and the validation verdict, identical from run to run.
 * Standard error: the best rate of each kernel (timings vary; they are not the output). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: stream MIB [NTIMES]\n");
        return 2;
    }
    size_t n = (size_t)atol(argv[1]) * 1048576 / (3 * sizeof(double));
    int ntimes = argc > 2 ? atoi(argv[2]) : 10;
    if (n < 1000 || ntimes < 2) {
        fprintf(stderr, "stream: arrays too small or fewer than 2 repetitions\n");
        return 2;
    }
    double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c);
    if (!a || !b || !c) {
        fprintf(stderr, "stream: cannot allocate 3 x %zu doubles\n", n);
        return 1;
    }
    const double scalar = 3.0;
    for (size_t j = 0; j < n; j++) {
        a[j] = 1.0;
        b[j] = 2.0;
        c[j] = 0.0;
    }
    for (size_t j = 0; j < n; j++)
        a[j] = 2.0E0 * a[j];
    static const char *label[4] = {"Copy", "Scale", "Add", "Triad"};
    static const double words[4] = {2, 2, 3, 3};
    double best[4] = {1e30, 1e30, 1e30, 1e30};
    for (int k = 0; k < ntimes; k++) {
        double t[5];
        t[0] = now();
        for (size_t j = 0; j < n; j++)
            c[j] = a[j];
        t[1] = now();
        for (size_t j = 0; j < n; j++)
            b[j] = scalar * c[j];
        t[2] = now();
        for (size_t j = 0; j < n; j++)
            c[j] = a[j] + b[j];
        t[3] = now();
        for (size_t j = 0; j < n; j++)
            a[j] = b[j] + scalar * c[j];
        t[4] = now();
        /* The first repetition is excluded from the rates, as the specification says. */
        for (int i = 0; k > 0 && i < 4; i++)
            if (t[i + 1] - t[i] < best[i])
                best[i] = t[i + 1] - t[i];
    }
    for (int i = 0; i < 4; i++)
        fprintf(stderr, "%-6s %12.1f MB/s\n", label[i], words[i] * sizeof(double) * n / best[i] / 1e6);

    /* Validation: replay the operations on scalars, compare the average absolute errors. */
    double aj = 1.0, bj = 2.0, cj = 0.0;
    aj = 2.0E0 * aj;
    for (int k = 0; k < ntimes; k++) {
        cj = aj;
        bj = scalar * cj;
        cj = aj + bj;
        aj = bj + scalar * cj;
    }
    double ea = 0, eb = 0, ec = 0;
    for (size_t j = 0; j < n; j++) {
        ea += fabs(a[j] - aj);
        eb += fabs(b[j] - bj);
        ec += fabs(c[j] - cj);
    }
    ea /= n;
    eb /= n;
    ec /= n;
    const double epsilon = 1.e-13;
    int ok = fabs(ea / aj) <= epsilon && fabs(eb / bj) <= epsilon && fabs(ec / cj) <= epsilon;
    printf("STREAM array size %zu doubles (%.1f MiB in all), %d times\n", n,
           3.0 * n * sizeof(double) / 1048576, ntimes);
    printf("expected a=%.6e b=%.6e c=%.6e\n", aj, bj, cj);
    printf(ok ? "Solution Validates: avg error less than %e on all three arrays\n"
              : "Failed Validation: avg error above %e\n",
           epsilon);
    free(a);
    free(b);
    free(c);
    return ok ? 0 : 1;
}
