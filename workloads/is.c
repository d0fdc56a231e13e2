/* is: IS-like bucket sort of integer keys (NAS Parallel Benchmarks IS): uniform keys of
 * KEY_BITS bits are scattered into buckets by their high bits, through a small write-combining
 * buffer per bucket (so each scatter writes WC keys in a row, as tuned radix sorts do), then
 * each bucket is sorted by counting its low bits. Keys and the bucket array together are SIZE MiB. Second argument:
 * sorts (default 2, each of fresh keys).
 * Self-check: sorted, and the same multiset as the keys generated. */
#include "wl.h"

enum { KEY_BITS = 24, BUCKET_BITS = 8, LOW_BITS = KEY_BITS - BUCKET_BITS, WC = 64 };
#define BUCKETS (1u << BUCKET_BITS)
#define LOW (1u << LOW_BITS)

static uint32_t key_at(uint64_t round, size_t i) {
    return (uint32_t)(wl_hash(round << 40 ^ i) >> (64 - KEY_BITS));
}

int main(int argc, char **argv) {
    uint64_t rounds = 2;
    size_t size = wl_args("is", argc, argv, &rounds);
    size_t n = size / (2 * sizeof(uint32_t));
    uint32_t *keys = wl_alloc(n * sizeof(uint32_t));
    uint32_t *buck = wl_alloc(n * sizeof(uint32_t));
    size_t *start = calloc(BUCKETS + 1, sizeof(size_t));
    size_t *fill = calloc(BUCKETS, sizeof(size_t));
    size_t *count = calloc(LOW, sizeof(size_t));
    uint32_t *wc = malloc(BUCKETS * WC * sizeof(uint32_t));
    uint32_t *wc_n = calloc(BUCKETS, sizeof(uint32_t));
    if (!start || !fill || !count || !wc || !wc_n)
        wl_fail("out of memory for the counters");

    double secs = 0;
    uint64_t check = 0;
    for (uint64_t r = 0; r < rounds; r++) {
        double t0 = wl_now();
        for (size_t i = 0; i < n; i++)
            keys[i] = key_at(r, i);
        memset(start, 0, (BUCKETS + 1) * sizeof(size_t));
        for (size_t i = 0; i < n; i++)
            start[(keys[i] >> LOW_BITS) + 1]++;
        for (size_t b = 0; b < BUCKETS; b++)
            start[b + 1] += start[b];
        memcpy(fill, start, BUCKETS * sizeof(size_t));
        for (size_t i = 0; i < n; i++) {
            uint32_t b = keys[i] >> LOW_BITS;
            wc[b * WC + wc_n[b]++] = keys[i];
            if (wc_n[b] == WC) {
                memcpy(&buck[fill[b]], &wc[b * WC], WC * sizeof(uint32_t));
                fill[b] += WC;
                wc_n[b] = 0;
            }
        }
        for (uint32_t b = 0; b < BUCKETS; b++) {
            memcpy(&buck[fill[b]], &wc[b * WC], wc_n[b] * sizeof(uint32_t));
            fill[b] += wc_n[b];
            wc_n[b] = 0;
        }
        for (size_t b = 0; b < BUCKETS; b++) {
            memset(count, 0, LOW * sizeof(size_t));
            for (size_t i = start[b]; i < start[b + 1]; i++)
                count[buck[i] & (LOW - 1)]++;
            size_t k = start[b];
            for (uint32_t low = 0; low < LOW; low++)
                for (size_t c = 0; c < count[low]; c++)
                    keys[k++] = (uint32_t)b << LOW_BITS | low;
        }
        secs += wl_now() - t0;

        uint64_t want = 0, got = 0;
        for (size_t i = 0; i < n; i++) {
            want += wl_hash(key_at(r, i));
            got += wl_hash(keys[i]);
            if (i > 0 && keys[i] < keys[i - 1])
                wl_fail("round %llu: not sorted at %zu", (unsigned long long)r, i);
            if (buck[i] >> LOW_BITS != (uint32_t)(keys[i] >> LOW_BITS))
                wl_fail("round %llu: bucket array disagrees at %zu", (unsigned long long)r, i);
        }
        if (want != got)
            wl_fail("round %llu: the sorted keys are not a permutation", (unsigned long long)r);
        check = wl_fold(check, got);
    }
    wl_ok(secs, check);
    wl_free(keys);
    wl_free(buck);
    free(start);
    free(fill);
    free(count);
    free(wc);
    free(wc_n);
    return 0;
}
