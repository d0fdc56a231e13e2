/* A program linked with Debian's libjemalloc (-ljemalloc) under `rmem run`: small and large
 * allocations, malloc_usable_size, realloc across the min-alloc boundary, calloc,
 * posix_memalign, jemalloc's own API (mallocx, rallocx, sallocx, nallocx, dallocx) and
 * malloc_trim/mallinfo2/mallopt, every byte checked. Built with -DNO_MALLOCX it links with
 * tcmalloc (-ltcmalloc) instead, which has no mallocx API. Prints "jemalloc: ok" or exits 1. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Declared here rather than from <jemalloc/jemalloc.h> and <malloc.h>, which disagree. */
size_t malloc_usable_size(void *);
void *mallocx(size_t, int);
void *rallocx(void *, size_t, int);
size_t sallocx(const void *, int);
size_t nallocx(size_t, int);
void dallocx(void *, int);
void sdallocx(void *, size_t, int);
int malloc_trim(size_t);
int mallopt(int, int);
struct mallinfo2 { size_t arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost; };
struct mallinfo2 mallinfo2(void);

#define LG_ALIGN(la) ((int)(la))
#define ZERO 0x40
#define N 64

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 31 + seed);
}
static int check(const unsigned char *p, size_t n, unsigned seed, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * 31 + seed)) {
            fprintf(stderr, "jemalloc: %s: byte %zu of %zu wrong\n", what, i, n);
            return 1;
        }
    return 0;
}

int main(void) {
    unsigned char *big[N], *small[N];
    size_t bsz[N], ssz[N];
    for (int i = 0; i < N; i++) {
        bsz[i] = (512u << 10) + (size_t)i * 4099;
        ssz[i] = 24 + (size_t)i * 37;
        big[i] = malloc(bsz[i]);
        small[i] = malloc(ssz[i]);
        if (!big[i] || !small[i]) { fprintf(stderr, "jemalloc: malloc failed\n"); return 1; }
        if (malloc_usable_size(big[i]) < bsz[i] || malloc_usable_size(small[i]) < ssz[i]) {
            fprintf(stderr, "jemalloc: usable size %zu < %zu or %zu < %zu\n",
                    malloc_usable_size(big[i]), bsz[i], malloc_usable_size(small[i]), ssz[i]);
            return 1;
        }
        fill(big[i], bsz[i], i);
        fill(small[i], ssz[i], i + 7);
    }
    /* Grow small blocks past the min-alloc boundary and big ones further; shrink some. */
    for (int i = 0; i < N; i++) {
        size_t ns = i % 2 ? 200u << 10 : ssz[i] + 100;
        small[i] = realloc(small[i], ns);
        if (!small[i] || check(small[i], ssz[i], i + 7, "realloc small")) return 1;
        fill(small[i], ns, i + 7);
        ssz[i] = ns;
        size_t nb = i % 3 ? bsz[i] + (1u << 20) : 100;
        big[i] = realloc(big[i], nb);
        size_t keep = nb < bsz[i] ? nb : bsz[i];
        if (!big[i] || check(big[i], keep, i, "realloc big")) return 1;
        fill(big[i], nb, i);
        bsz[i] = nb;
        if (malloc_usable_size(big[i]) < bsz[i] || malloc_usable_size(small[i]) < ssz[i]) {
            fprintf(stderr, "jemalloc: usable size after realloc too small\n");
            return 1;
        }
    }
    unsigned char *z = calloc(3, 1 << 20);
    for (size_t i = 0; i < 3u << 20; i++) if (z[i]) { fprintf(stderr, "jemalloc: calloc not zero\n"); return 1; }
    void *a = NULL;
    if (posix_memalign(&a, 4096, 1 << 20) || (uintptr_t)a % 4096) { fprintf(stderr, "jemalloc: posix_memalign\n"); return 1; }
    fill(a, 1 << 20, 3);
#ifndef NO_MALLOCX
    /* jemalloc's own API, on blocks that are not jemalloc's. */
    unsigned char *x = mallocx(300 << 10, LG_ALIGN(16) | ZERO);
    if (!x || (uintptr_t)x % 65536 || x[12345] || sallocx(x, 0) < 300u << 10 || nallocx(300 << 10, 0) < 300u << 10) {
        fprintf(stderr, "jemalloc: mallocx/sallocx/nallocx\n");
        return 1;
    }
    fill(x, 300 << 10, 9);
    x = rallocx(x, 900 << 10, 0);
    if (!x || check(x, 300 << 10, 9, "rallocx")) return 1;
    dallocx(x, 0);
    unsigned char *y = mallocx(100, 0);
    fill(y, 100, 1);
    sdallocx(y, 100, 0);
#endif
    struct mallinfo2 mi = mallinfo2();
    malloc_trim(0);
    mallopt(-1 /* M_TRIM_THRESHOLD */, 1 << 20);
    for (int i = 0; i < N; i++) {
        if (check(big[i], bsz[i], i, "big") || check(small[i], ssz[i], i + 7, "small")) return 1;
        free(big[i]);
        free(small[i]);
    }
    if (check(a, 1 << 20, 3, "memalign")) return 1;
    free(a);
    free(z);
    char *s = strdup("still glibc's");
    if (malloc_usable_size(s) < 14) { fprintf(stderr, "jemalloc: strdup usable size\n"); return 1; }
    free(s);
    printf("jemalloc: ok (mallinfo2 hblkhd %zu)\n", mi.hblkhd);
    return 0;
}
