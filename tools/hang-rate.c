/* Random read-modify-writes of 8-byte words over 64 MiB for SECONDS (default 14), printing
 * "SECONDS_SINCE_START OPS" every 0.5 s, then "sum S ops N": the sum of every word and the
 * operations in all. Word i starts at i and each operation adds 1 to one word, so S must be
 * N + W(W-1)/2 for W words: a check of every byte, whatever the run's speed.
 * tools/pager-hang.sh runs it under rmem run while a server hangs. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    size_t n = (64u << 20) / 8;
    double secs = argc > 1 ? atof(argv[1]) : 14;
    uint64_t *a = malloc(n * 8);
    if (!a) return 1;
    for (size_t i = 0; i < n; i++) a[i] = i;
    uint64_t x = 88172645463325252ull, ops = 0, total = 0;
    double t0 = now(), last = t0;
    printf("start\n");
    fflush(stdout);
    for (;;) {
        for (int k = 0; k < 1000; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            a[x % n] += 1;
            ops++;
            total++;
        }
        double t = now();
        if (t - last >= 0.5) {
            printf("%.2f %llu\n", t - t0, (unsigned long long)ops);
            fflush(stdout);
            ops = 0;
            last = t;
        }
        if (t - t0 > secs) break;
    }
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++) s += a[i];
    printf("sum %llu ops %llu\n", (unsigned long long)s, (unsigned long long)total);
    return 0;
}
