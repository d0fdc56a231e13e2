/* Common pieces of the rmem workloads: allocation, size argument, data that does not
 * compress, timing, and the one result line every workload prints.
 *
 * Every workload takes its data size in MiB as the first argument, fills its data from
 * wl_hash (values that neither zram nor a zero-page check can flatter), self-checks its
 * result, and prints
 *     workload NAME ok seconds=S checksum=HEX
 * or exits 1 with "workload NAME FAILED: reason" on stderr.
 *
 * Allocation: with RMEM_MODE=api (set by `rmem run --api`) the data goes through the DLM API
 * (dlm_alloc, remote memory); otherwise through malloc, so the same binary runs on plain
 * memory, under kernel swap, and under rmem's transparent mode. */
#ifndef WL_H
#define WL_H

#include <dlm.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *wl_name = "?";

static void wl_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "workload %s FAILED: ", wl_name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static int wl_use_api(void) {
    static int api = -1;
    if (api < 0) {
        const char *m = getenv("RMEM_MODE");
        api = m != NULL && strcmp(m, "api") == 0;
    }
    return api;
}

/* Uninitialised memory (dlm_alloc's is zeroed, malloc's is not): workloads fill it. */
static void *wl_alloc(size_t size) {
    void *p = wl_use_api() ? dlm_alloc(size) : malloc(size);
    if (p == NULL)
        wl_fail("cannot allocate %zu bytes (%s)", size, wl_use_api() ? "dlm_alloc" : "malloc");
    return p;
}

static void wl_free(void *p) {
    if (wl_use_api())
        dlm_free(p);
    else
        free(p);
}

/* Parse "NAME SIZE_MIB [extra]"; returns the data size in bytes. `extra`, if given, gets the
 * second argument as a number, or keeps its default. */
static size_t wl_args(const char *name, int argc, char **argv, uint64_t *extra) {
    wl_name = name;
    if (argc < 2) {
        fprintf(stderr, "usage: %s SIZE_MIB [N]\n", argv[0]);
        exit(2);
    }
    char *end;
    unsigned long long mib = strtoull(argv[1], &end, 10);
    if (*end != '\0' || mib == 0 || mib > (1ull << 24))
        wl_fail("bad size %s (MiB, 1 .. 2^24)", argv[1]);
    if (extra != NULL && argc > 2) {
        *extra = strtoull(argv[2], &end, 10);
        if (*end != '\0')
            wl_fail("bad argument %s", argv[2]);
    }
    return (size_t)mib << 20;
}

/* splitmix64: a hash of an index, so any element's initial value can be recomputed without
 * reading memory (the self-checks use this). */
static inline uint64_t wl_hash(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A double in [1, 2) with 52 random mantissa bits. */
static inline double wl_hash_double(uint64_t x) {
    return 1.0 + (double)(wl_hash(x) >> 12) * (1.0 / 4503599627370496.0);
}

/* xorshift64: a stream of random numbers (state must not be 0). */
static inline uint64_t wl_rand(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static double wl_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Fold a 64-bit value into a checksum (order-dependent). */
static inline uint64_t wl_fold(uint64_t sum, uint64_t v) {
    return wl_hash(sum ^ v);
}

static inline uint64_t wl_bits(double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static void wl_ok(double seconds, uint64_t checksum) {
    printf("workload %s ok seconds=%.6f checksum=%016llx\n", wl_name, seconds,
           (unsigned long long)checksum);
    fflush(stdout);
}

#endif /* WL_H */
