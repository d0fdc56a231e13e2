/*
 * copy-offsets: what memcpy costs by the offset between destination and source, and which
 * of a process's copies fall in the slow case. A reference for rmem-copy, not part of rmem.
 *
 * On CPUs with fast short rep movsb (FSRM: AMD Zen 3 and others) glibc copies 2 KiB to
 * 512 KiB with `rep movsb`, which on Zen 3 is about twenty times slower when the destination
 * is 1 to 31 bytes after the source modulo 4096.
 *
 * Timing (prints one line per offset, microseconds per copy, memcpy against a loop of 16-byte
 * vector loads and stores like rmem_copy's):
 *   cc -O2 -o copy-offsets tools/copy-offsets.c && ./copy-offsets [bytes]
 *
 * Counting (an LD_PRELOAD library over memcpy: for every copy of 2 KiB or more, by caller,
 * how many had (dst - src) % 4096 in 1..63; one file per process in DIR at its exit):
 *   cc -O2 -shared -fPIC -DSHIM -o copy-offsets.so tools/copy-offsets.c -ldl
 *   COPY_OFFSETS_DIR=/tmp/co LD_PRELOAD=$PWD/copy-offsets.so PROGRAM ...
 *   then addr2line -f -i -C -e BINARY OFFSET for the callers of interest.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int slow_offset(const void *d, const void *s)
{
    uintptr_t k = ((uintptr_t)d - (uintptr_t)s) & 4095;
    return k > 0 && k < 64;
}

#ifdef SHIM
#include <dlfcn.h>
#include <stdatomic.h>
#include <unistd.h>

#define CALLERS 128
static void *callers[CALLERS];
static _Atomic uint64_t copies[CALLERS], slow[CALLERS];
static _Atomic int used;

static int slot(void *ra)
{
    int n = atomic_load(&used);
    for (int i = 0; i < n && i < CALLERS; i++)
        if (callers[i] == ra)
            return i;
    int i = atomic_fetch_add(&used, 1);
    if (i >= CALLERS)
        return CALLERS - 1; /* the last slot takes the rest */
    callers[i] = ra;
    return i;
}

/* glibc's own memcpy is not reachable by name from here, so copy as it would: rep movsb. */
void *memcpy(void *d, const void *s, size_t n)
{
    void *ret = d;
    if (n >= 2048) {
        int i = slot(__builtin_return_address(0));
        copies[i]++;
        if (slow_offset(d, s))
            slow[i]++;
    }
    __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
    return ret;
}

__attribute__((destructor)) static void report(void)
{
    const char *dir = getenv("COPY_OFFSETS_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/%d", dir ? dir : "/tmp", (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    int n = used < CALLERS ? used : CALLERS;
    for (int i = 0; i < n; i++) {
        Dl_info info;
        if (!dladdr(callers[i], &info))
            continue;
        fprintf(f, "%s 0x%lx copies %lu slow %lu\n", info.dli_fname,
                (unsigned long)((char *)callers[i] - (char *)info.dli_fbase), copies[i], slow[i]);
    }
    fclose(f);
}
#else
#include <immintrin.h>
#include <time.h>

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void vector_copy(char *d, const char *s, size_t n)
{
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_storeu_si128((__m128i *)(d + i), a);
        _mm_storeu_si128((__m128i *)(d + i + 16), b);
        _mm_storeu_si128((__m128i *)(d + i + 32), c);
        _mm_storeu_si128((__m128i *)(d + i + 48), e);
    }
    memcpy(d + i, s + i, n - i);
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoul(argv[1], NULL, 0) : 65536;
    char *src = aligned_alloc(4096, n + 8192), *dst = aligned_alloc(4096, n + 8192);
    memset(src, 1, n + 8192);
    memset(dst, 2, n + 8192);
    int reps = (int)(((size_t)1 << 28) / n / 8) + 1;
    int offsets[] = {0, 1, 8, 16, 24, 31, 32, 48, 63, 64, 2048, 4064, 4095};
    printf("bytes %zu\n", n);
    for (size_t k = 0; k < sizeof offsets / sizeof offsets[0]; k++) {
        char *d = dst + offsets[k];
        double t = now_ns();
        for (int r = 0; r < reps; r++) {
            memcpy(d, src, n);
            __asm__ volatile("" : : "r"(d) : "memory");
        }
        double m = (now_ns() - t) / reps / 1000;
        t = now_ns();
        for (int r = 0; r < reps; r++) {
            vector_copy(d, src, n);
            __asm__ volatile("" : : "r"(d) : "memory");
        }
        double v = (now_ns() - t) / reps / 1000;
        printf("offset %4d%s memcpy %.2f us, vector loop %.2f us\n", offsets[k],
               slow_offset(d, src) ? " (rmem_copy loops)" : "                  ", m, v);
    }
    return 0;
}
#endif
