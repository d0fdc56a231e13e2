/* cluster: hierarchical clustering as Cluster 3.0's pairwise maximum-linkage (pmlcluster):
 * each step scans the whole lower-triangular distance matrix of the remaining nodes for the
 * closest pair, merges it, and moves the last row into the freed one, so the matrix shrinks
 * by a row per step. The matrix is SIZE MiB of floats. Second argument: merge steps (default
 * 16; a full clustering would take hours at real sizes).
 * Self-check: the first pair equals the minimum of the generated distances (computed without
 * reading memory), and merge distances never decrease (true of complete linkage). */
#include <math.h>
#include "wl.h"

static float *dm;

static size_t row(size_t i) {
    return i * (i - 1) / 2;
}
#define D(i, j) dm[row(i) + (j)] /* i > j */

static float initial(size_t i, size_t j) {
    return (float)(wl_hash_double(row(i) + j) - 1.0);
}

/* The closest pair (is > js) among the first n nodes; the first in scan order on ties. */
static float closest(size_t n, float (*d)(size_t, size_t), size_t *is, size_t *js) {
    float best = INFINITY;
    for (size_t i = 1; i < n; i++)
        for (size_t j = 0; j < i; j++)
            if (d(i, j) < best) {
                best = d(i, j);
                *is = i;
                *js = j;
            }
    return best;
}

static inline float stored(size_t i, size_t j) {
    return D(i, j);
}

static float maxf(float a, float b) {
    return a > b ? a : b;
}

int main(int argc, char **argv) {
    uint64_t steps = 16;
    size_t size = wl_args("cluster", argc, argv, &steps);
    size_t n = (size_t)((1.0 + sqrt(1.0 + 8.0 * (double)(size / sizeof(float)))) / 2.0);
    while (row(n) > size / sizeof(float))
        n--;
    if (n < 4)
        wl_fail("size too small");
    if (steps > n - 2)
        steps = n - 2;
    dm = wl_alloc(row(n) * sizeof(float));

    double t0 = wl_now();
    for (size_t i = 1; i < n; i++)
        for (size_t j = 0; j < i; j++)
            D(i, j) = initial(i, j);
    size_t first_is = 0, first_js = 0;
    float first = 0, last = 0;
    uint64_t check = 0;
    for (size_t nodes = n; nodes > n - steps; nodes--) {
        size_t is = 0, js = 0;
        float dist = closest(nodes, stored, &is, &js);
        if (nodes == n) {
            first = dist;
            first_is = is;
            first_js = js;
        } else if (dist < last) {
            wl_fail("merge distance decreased from %g to %g", last, dist);
        }
        last = dist;
        check = wl_fold(check, is << 32 ^ js ^ wl_bits(dist));
        for (size_t j = 0; j < js; j++)
            D(js, j) = maxf(D(is, j), D(js, j));
        for (size_t j = js + 1; j < is; j++)
            D(j, js) = maxf(D(is, j), D(j, js));
        for (size_t j = is + 1; j < nodes; j++)
            D(j, js) = maxf(D(j, is), D(j, js));
        for (size_t j = 0; j < is; j++)
            D(is, j) = D(nodes - 1, j);
        for (size_t j = is + 1; j + 1 < nodes; j++)
            D(j, is) = D(nodes - 1, j);
    }
    double secs = wl_now() - t0;

    size_t want_is = 0, want_js = 0;
    float want = closest(n, initial, &want_is, &want_js);
    if (want != first || want_is != first_is || want_js != first_js)
        wl_fail("first pair (%zu,%zu) at %g, expected (%zu,%zu) at %g", first_is, first_js,
                first, want_is, want_js, want);
    wl_ok(secs, check);
    wl_free(dm);
    return 0;
}
