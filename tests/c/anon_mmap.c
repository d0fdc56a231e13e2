/* Private anonymous mappings as a program's own allocator makes them (CPython's arenas,
 * OpenBLAS's buffers), for `rmem run --anon-mmap`: MIB MiB in 1 MiB mappings, each written
 * and read back after all were written (so that, with a small local budget, they were paged
 * out and back); then what programs do with such mappings: munmap of a part, mremap growing
 * one (it may move), madvise(MADV_DONTNEED) reading back zeros, mprotect to read-only and
 * back. Mappings rmem leaves to the kernel must keep their meaning: a MAP_SHARED one is shared
 * with a fork child, a PROT_NONE reservation becomes usable piece by piece with mprotect.
 * Usage: anon_mmap MIB. Prints "anon_mmap ok CHECKSUM" or exits 1 saying what failed. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define MB (1u << 20)

static void fail(const char *what) {
    fprintf(stderr, "anon_mmap FAILED: %s\n", what);
    exit(1);
}

static uint64_t word(size_t arena, size_t i) {
    uint64_t x = (arena + 1) * 0x9E3779B97F4A7C15ull ^ (i * 0xBF58476D1CE4E5B9ull);
    return x ^ (x >> 31);
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? (size_t)atol(argv[1]) : 64;
    uint64_t **a = calloc(n, sizeof *a);
    for (size_t k = 0; k < n; k++) {
        a[k] = mmap(NULL, MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (a[k] == MAP_FAILED)
            fail("mmap");
        if (((uintptr_t)a[k] & 4095) != 0)
            fail("mapping not page-aligned");
        for (size_t i = 0; i < MB / 8; i++) {
            if (a[k][i] != 0)
                fail("a fresh mapping is not zero");
            a[k][i] = word(k, i);
        }
    }
    uint64_t sum = 0;
    for (size_t k = 0; k < n; k++)
        for (size_t i = 0; i < MB / 8; i++) {
            if (a[k][i] != word(k, i))
                fail("read back differs");
            sum += a[k][i];
        }
    /* munmap of the second half of mapping 0; the first half keeps its data. */
    if (munmap((char *)a[0] + MB / 2, MB / 2) != 0)
        fail("munmap of a half");
    for (size_t i = 0; i < MB / 16; i++)
        if (a[0][i] != word(0, i))
            fail("the half left after munmap differs");
    /* mremap: grow mapping 1 to 4 MiB (may move), data kept, the new part zero. */
    uint64_t *g = mremap(a[1], MB, 4 * MB, MREMAP_MAYMOVE);
    if (g == MAP_FAILED)
        fail("mremap");
    for (size_t i = 0; i < MB / 8; i++)
        if (g[i] != word(1, i))
            fail("mremap lost data");
    for (size_t i = MB / 8; i < 4 * MB / 8; i++)
        if (g[i] != 0)
            fail("mremap's new part is not zero");
    a[1] = g;
    /* madvise(MADV_DONTNEED) on a private anonymous mapping: reads back zeros. */
    if (madvise(a[2], MB, MADV_DONTNEED) != 0)
        fail("madvise");
    for (size_t i = 0; i < MB / 8; i++)
        if (a[2][i] != 0)
            fail("MADV_DONTNEED did not zero");
    /* mprotect read-only and back. */
    if (mprotect(a[3], MB, PROT_READ) != 0 || a[3][7] != word(3, 7)
        || mprotect(a[3], MB, PROT_READ | PROT_WRITE) != 0)
        fail("mprotect");
    a[3][7] = 1;
    /* MAP_SHARED: a fork child's writes are seen by the parent. */
    volatile uint64_t *sh = mmap(NULL, MB, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        fail("mmap shared");
    pid_t pid = fork();
    if (pid == 0) {
        sh[1000] = 0xfeedface;
        _exit(0);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("fork child");
    if (sh[1000] != 0xfeedface)
        fail("a MAP_SHARED mapping is not shared with a fork child");
    /* A PROT_NONE reservation, made usable piece by piece. */
    char *r = mmap(NULL, 64 * MB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED || mprotect(r, 2 * MB, PROT_READ | PROT_WRITE) != 0)
        fail("reservation");
    memset(r, 7, 2 * MB);
    if (r[2 * MB - 1] != 7)
        fail("reservation data");
    for (size_t k = 0; k < n; k++)
        if (munmap(a[k], k == 0 ? MB / 2 : k == 1 ? 4 * MB : MB) != 0)
            fail("final munmap");
    printf("anon_mmap ok %016llx\n", (unsigned long long)sum);
    return 0;
}
