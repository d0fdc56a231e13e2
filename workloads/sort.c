/* sort: bottom-up merge sort of 64-bit keys (the qsort case of the swap comparisons; merge
 * passes are sequential scans). Keys and the merge buffer together are SIZE MiB.
 * Self-check: the result is sorted, and its sum and hashed sum equal those of the keys
 * generated (recomputed without reading memory). */
#include "wl.h"

static void merge(const uint64_t *src, uint64_t *dst, size_t lo, size_t mid, size_t hi) {
    size_t i = lo, j = mid, k = lo;
    while (i < mid && j < hi)
        dst[k++] = src[j] < src[i] ? src[j++] : src[i++];
    while (i < mid)
        dst[k++] = src[i++];
    while (j < hi)
        dst[k++] = src[j++];
}

int main(int argc, char **argv) {
    size_t size = wl_args("sort", argc, argv, NULL);
    size_t n = size / (2 * sizeof(uint64_t));
    uint64_t *keys = wl_alloc(n * sizeof(uint64_t));
    uint64_t *tmp = wl_alloc(n * sizeof(uint64_t));

    double t0 = wl_now();
    for (size_t i = 0; i < n; i++)
        keys[i] = wl_hash(i);
    uint64_t *src = keys, *dst = tmp;
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n;
            size_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            merge(src, dst, lo, mid, hi);
        }
        uint64_t *x = src;
        src = dst;
        dst = x;
    }
    double secs = wl_now() - t0;

    uint64_t want_sum = 0, want_hsum = 0, sum = 0, hsum = 0, check = 0;
    for (size_t i = 0; i < n; i++) {
        want_sum += wl_hash(i);
        want_hsum += wl_hash(wl_hash(i));
        if (i > 0 && src[i] < src[i - 1])
            wl_fail("not sorted at %zu", i);
        sum += src[i];
        hsum += wl_hash(src[i]);
        check = wl_fold(check, src[i]);
    }
    if (sum != want_sum || hsum != want_hsum)
        wl_fail("the sorted keys are not a permutation of the keys");
    wl_ok(secs, check);
    wl_free(keys);
    wl_free(tmp);
    return 0;
}
