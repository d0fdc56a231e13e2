/* Private anonymous mappings as a program's own allocator makes them (CPython's arenas,
 * OpenBLAS's buffers), for `rmem run --anon-mmap`: MIB MiB in 1 MiB mappings, each written
 * and read back after all were written (so that, with a small local budget, they were paged
 * out and back); then what programs do with such mappings: munmap of a part, mremap growing
 * one (it may move), madvise(MADV_DONTNEED) reading back zeros, mprotect to read-only and
 * back. Mappings rmem leaves to the kernel must keep their meaning: a MAP_SHARED one is shared
 * with a fork child. A managed runtime's heap: a PROT_NONE reservation (remote memory too),
 * committed and uncommitted with mmap(MAP_FIXED) and mprotect, a file placed in it.
 * Usage: anon_mmap MIB. Prints "anon_mmap ok CHECKSUM" or exits 1 saying what failed.
 * `anon_mmap MIB shared-fixed`: see shared_fixed(). */
#define _GNU_SOURCE
#include <errno.h>
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

/* `anon_mmap MIB shared-fixed`: a MAP_SHARED mapping placed with MAP_FIXED over a private
 * one of MIB MiB that was written (remote memory under `rmem run --anon-mmap`, which refuses
 * it: rmem cannot page a shared mapping). Prints "shared-fixed mapped" or "shared-fixed
 * refused errno N", then checks that the private mapping kept its data through paging. */
static int shared_fixed(size_t n) {
    uint64_t *p = mmap(NULL, n * MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        fail("mmap");
    for (size_t i = 0; i < n * MB / 8; i++)
        p[i] = word(0, i);
    void *q = mmap(p, 64 * 1024, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (q == MAP_FAILED) {
        printf("shared-fixed refused errno %d\n", errno);
        for (int pass = 0; pass < 2; pass++)
            for (size_t i = 0; i < n * MB / 8; i++)
                if (p[i] != word(0, i))
                    fail("the private mapping lost data");
    } else {
        printf("shared-fixed mapped\n");
    }
    return 0;
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? (size_t)atol(argv[1]) : 64;
    if (argc > 2 && strcmp(argv[2], "shared-fixed") == 0)
        return shared_fixed(n);
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
    /* A managed runtime's heap (the JVM's, V8's): a PROT_NONE reservation at a hinted
     * address, made usable piece by piece with mmap(MAP_FIXED) and mprotect, given back with
     * mmap(MAP_FIXED, PROT_NONE) and madvise, a file's bytes placed in it; boundaries inside
     * 64 KiB pages. Everything written is checked after the arenas were read again (so that,
     * with a small budget, the reservation's pages were paged out and back). */
    size_t rlen = 16 * MB;
    char *r = mmap((void *)0x200000000ull, rlen, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED)
        fail("reservation");
    if (mmap(r, 4 * MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != r)
        fail("commit with mmap(MAP_FIXED)");
    for (size_t i = 0; i < 4 * MB; i++)
        if (r[i] != 0)
            fail("a committed range is not zero");
    memset(r, 7, 4 * MB);
    char *m = r + 4 * MB + 12 * 1024; /* inside a 64 KiB page */
    if (mprotect(m, 3 * MB, PROT_READ | PROT_WRITE) != 0)
        fail("commit with mprotect");
    memset(m, 9, 3 * MB);
    /* Uncommit part of the first range, then commit it again: it reads zero. */
    char *u = r + MB + 20 * 1024;
    if (mmap(u, MB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) != u)
        fail("uncommit with mmap(MAP_FIXED, PROT_NONE)");
    if (mmap(u, MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != u)
        fail("commit again");
    /* madvise(MADV_DONTNEED) of an inaccessible part (as V8 does before PROT_NONE). */
    char *d = m + MB + 4096;
    if (mprotect(d, 64 * 1024, PROT_NONE) != 0 || madvise(d, 64 * 1024, MADV_DONTNEED) != 0
        || mprotect(d, 64 * 1024, PROT_READ | PROT_WRITE) != 0)
        fail("madvise of an inaccessible part");
    /* A file's bytes, mapped private at a fixed place in the reservation, read-only and
     * executable (as V8 remaps its builtins), then made writable: the file keeps its bytes. */
    char path[] = "/tmp/anon_mmap_XXXXXX";
    int fd = mkstemp(path);
    size_t flen = 100 * 1000;
    unsigned char *fb = malloc(flen);
    for (size_t i = 0; i < flen; i++)
        fb[i] = (unsigned char)(i * 131 + 7);
    if (fd < 0 || write(fd, fb, flen) != (ssize_t)flen)
        fail("temporary file");
    unlink(path);
    unsigned char *f = (unsigned char *)r + 12 * MB + 8192;
    if (mmap(f, 128 * 1024, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED, fd, 0) != f)
        fail("mmap(MAP_FIXED) of a file in the reservation");
    if (memcmp(f, fb, flen) != 0)
        fail("the file's bytes differ");
    for (size_t i = flen; i < 102400; i++)
        if (f[i] != 0)
            fail("bytes after the file's end are not zero");
    if (mprotect(f, 128 * 1024, PROT_READ | PROT_WRITE) != 0)
        fail("mprotect of the file's range");
    f[5] ^= 0xff;
    unsigned char c;
    if (pread(fd, &c, 1, 5) != 1 || c != fb[5])
        fail("a private file mapping changed the file");
    close(fd);
    /* Parts of one 64 KiB page made accessible at different times, so that the kernel keeps
     * them as two mappings (each got its own anon_vma) even with one protection: the page must
     * still be paged out and back. */
    char *sp = r + 14 * MB;
    if (mprotect(sp, 76 * 1024, PROT_READ | PROT_WRITE) != 0
        || mprotect(sp + 84 * 1024, 108 * 1024, PROT_READ | PROT_WRITE) != 0)
        fail("mprotect of the split page's neighbours");
    sp[0] = 1;
    sp[150 * 1024] = 2;
    if (mprotect(sp + 76 * 1024, 8 * 1024, PROT_READ | PROT_WRITE) != 0)
        fail("mprotect of the split page's gap");
    sp[70 * 1024] = 3;
    sp[80 * 1024] = 4;
    /* The same on memory that was remote from the start (an arena): a fixed mapping over part
     * of it (as jemalloc decommits), and madvise of an inaccessible part of it. */
    char *x = (char *)a[5] + 60 * 1024;
    if (mmap(x, 72 * 1024, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != x)
        fail("mmap(MAP_FIXED) over an arena");
    char *y = (char *)a[6] + 68 * 1024;
    if (mprotect(y, 8192, PROT_NONE) != 0 || madvise(y, 8192, MADV_DONTNEED) != 0
        || mprotect(y, 8192, PROT_READ | PROT_WRITE) != 0)
        fail("madvise of an inaccessible part of an arena");
    for (size_t i = 0; i < MB / 8; i++) {
        int in5 = (char *)&a[5][i] >= x && (char *)&a[5][i] < x + 72 * 1024;
        int in6 = (char *)&a[6][i] >= y && (char *)&a[6][i] < y + 8192;
        if (a[5][i] != (in5 ? 0 : word(5, i)))
            fail("an arena after mmap(MAP_FIXED) over part of it");
        if (a[6][i] != (in6 ? 0 : word(6, i)))
            fail("an arena after madvise of part of it");
        a[5][i] = word(5, i);
        a[6][i] = word(6, i);
    }
    if (mmap(r, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) != MAP_FAILED
        || errno != EEXIST)
        fail("MAP_FIXED_NOREPLACE over a mapping did not fail with EEXIST");
    for (size_t k = 4; k < n; k++)
        for (size_t i = 0; i < MB / 8; i++)
            if (a[k][i] != word(k, i))
                fail("read back differs (second pass)");
    for (size_t i = 0; i < 4 * MB; i++)
        if (r[i] != ((char *)u <= r + i && r + i < u + MB ? 0 : 7))
            fail("the committed range's data");
    for (size_t i = 0; i < 3 * MB; i++)
        if (m[i] != (d <= m + i && m + i < d + 64 * 1024 ? 0 : 9))
            fail("the mprotect-committed range's data");
    if (sp[0] != 1 || sp[150 * 1024] != 2 || sp[70 * 1024] != 3 || sp[80 * 1024] != 4)
        fail("the split page's data");
    if (f[5] != (fb[5] ^ 0xff) || memcmp(f + 6, fb + 6, flen - 6) != 0)
        fail("the file's range after paging");
    if (munmap(r, rlen) != 0)
        fail("munmap of the reservation");
    for (size_t k = 0; k < n; k++)
        if (munmap(a[k], k == 0 ? MB / 2 : k == 1 ? 4 * MB : MB) != 0)
            fail("final munmap");
    printf("anon_mmap ok %016llx\n", (unsigned long long)sum);
    return 0;
}
