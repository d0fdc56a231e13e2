#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
int main(int argc, char **argv) {
    size_t n = (argc > 1 ? atol(argv[1]) : 256) << 20;
    long updates = argc > 2 ? atol(argv[2]) : 100000;
    size_t words = n / 8;
    uint64_t *a = malloc(n);
    for (size_t i = 0; i < words; i++) a[i] = i;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t x = 88172645463325252ull, sum = 0;
    for (long u = 0; u < updates; u++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        size_t i = x % words;
        { volatile uint64_t *p = &a[i]; uint64_t v = *p; *p = v + 1; }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    for (size_t i = 0; i < words; i++) sum += a[i] - i;
    printf("updates %ld sum %lu %.3f s\n", updates, sum, (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    return sum != (uint64_t)updates;
}
