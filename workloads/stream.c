/* stream: STREAM-like copy, scale, add and triad over three arrays (McCalpin's STREAM; DLM
 * Fig. 6). The three arrays together are SIZE MiB. Second argument: iterations (default 5).
 * Self-check: every element is recomputed from its initial value with the same operations
 * in the same order, so results must match bit for bit. */
#include "wl.h"

static const double scalar = 3.0;

int main(int argc, char **argv) {
    uint64_t iters = 5;
    size_t size = wl_args("stream", argc, argv, &iters);
    size_t n = size / (3 * sizeof(double));
    double *a = wl_alloc(n * sizeof(double));
    double *b = wl_alloc(n * sizeof(double));
    double *c = wl_alloc(n * sizeof(double));

    double t0 = wl_now();
    for (size_t i = 0; i < n; i++) {
        a[i] = wl_hash_double(i);
        b[i] = 2.0;
        c[i] = 0.0;
    }
    for (uint64_t it = 0; it < iters; it++) {
        for (size_t i = 0; i < n; i++) /* copy */
            c[i] = a[i];
        for (size_t i = 0; i < n; i++) /* scale */
            b[i] = scalar * c[i];
        for (size_t i = 0; i < n; i++) /* add */
            c[i] = a[i] + b[i];
        for (size_t i = 0; i < n; i++) /* triad */
            a[i] = b[i] + scalar * c[i];
    }
    double secs = wl_now() - t0;

    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        double ea = wl_hash_double(i), eb = 2.0, ec = 0.0;
        for (uint64_t it = 0; it < iters; it++) {
            ec = ea;
            eb = scalar * ec;
            ec = ea + eb;
            ea = eb + scalar * ec;
        }
        if (a[i] != ea || b[i] != eb || c[i] != ec)
            wl_fail("element %zu: a=%g b=%g c=%g, expected %g %g %g", i, a[i], b[i], c[i], ea,
                    eb, ec);
        sum += wl_bits(a[i]) ^ wl_bits(b[i]) ^ wl_bits(c[i]);
    }
    wl_ok(secs, sum);
    wl_free(a);
    wl_free(b);
    wl_free(c);
    return 0;
}
