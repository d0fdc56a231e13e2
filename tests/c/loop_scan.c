/* Loops over an array PASSES times (reading every element, writing every 8th page), then
 * checks the sum: a small program whose page reference string is known, for trace tests.
 * Usage: loop_scan MIB PASSES */
#include <dlm.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 1;
    int passes = argc > 2 ? atoi(argv[2]) : 3;
    size_t n = mib << 17; /* 8-byte elements */
    unsigned long long *a = dlm_alloc(n * sizeof *a);
    if (!a) {
        fprintf(stderr, "loop_scan: dlm_alloc failed\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        a[i] = i;
    unsigned long long sum = 0;
    for (int p = 0; p < passes; p++)
        for (size_t i = 0; i < n; i++) {
            sum += a[i];
            if (i % 4096 == 0)
                a[i] += 0; /* a write to every 8th 4 KiB page */
        }
    unsigned long long want = (unsigned long long)passes * (n * (n - 1) / 2);
    if (sum != want) {
        fprintf(stderr, "loop_scan: sum %llu, want %llu\n", sum, want);
        return 1;
    }
    printf("loop_scan ok\n");
    dlm_free(a);
    return 0;
}
