/* A STREAM-like triad over dlm_alloc'ed arrays: a[i] = b[i] + s * c[i].
 * The DLM API example: build with
 *   cc -O2 -Iinclude examples/dlm_stream.c -Ltarget/release -lrmem -Wl,-rpath,$PWD/target/release -o dlm_stream
 * and run with
 *   target/release/rmem run --api --local 64M -- ./dlm_stream 256
 * to put 3 x 256 MiB of arrays on two local memory servers with 64 MiB resident. */
#include <dlm.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 128;
    dlm_init(&argc, &argv);
    size_t n = (mib << 20) / sizeof(double);
    double *a = dlm_alloc(n * sizeof(double));
    double *b = dlm_alloc(n * sizeof(double));
    double *c = dlm_alloc(n * sizeof(double));
    if (!a || !b || !c) {
        fprintf(stderr, "dlm_stream: dlm_alloc failed\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        b[i] = (double)(i % 1000) * 0.5;
        c[i] = (double)(i % 7);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t i = 0; i < n; i++) a[i] = b[i] + 3.0 * c[i];
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    for (size_t i = 0; i < n; i += 4099)
        if (a[i] != (double)(i % 1000) * 0.5 + 3.0 * (double)(i % 7)) {
            fprintf(stderr, "dlm_stream: wrong result at %zu\n", i);
            return 1;
        }
    printf("dlm_stream: triad over 3 x %zu MiB in %.3f s (%.0f MB/s), results verified\n", mib, secs,
           3.0 * (double)(mib << 20) / secs / 1e6);
    dlm_free(a);
    dlm_free(b);
    dlm_free(c);
    dlm_exit();
    return 0;
}
