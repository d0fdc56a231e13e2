/* The memory calls a program makes on remote memory, with the meaning Linux gives them. Every
 * buffer is a fresh malloc that lands in the rmem region (transparent mode), bigger than the
 * local budget, so the calls meet pages that are resident, clean, dirty and evicted. Checks
 * the data of each case and prints "memcalls CASE: ok" or exits 1.
 *
 *   memcalls CASE MIB     CASE: madvise | raw-madvise | free | raw-free | munmap | mremap |
 *                               mprotect | mlock | stacks
 *                         (MIB per buffer; run with a local budget of a MiB and 16 KiB pages) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PIECE 4096
static size_t n;
static int failures;

static unsigned char pattern(size_t i, unsigned seed) {
    return (unsigned char)((i / 7) * 31 + seed * 17 + 1) | 1; /* never 0 */
}

static void fill(unsigned char *p, size_t len, unsigned seed) {
    for (size_t i = 0; i < len; i++) p[i] = pattern(i, seed);
}

/* Evict everything: touch a different buffer bigger than the budget. */
static unsigned char *churned;
static void churn(void) {
    if (!churned) churned = malloc(n * 2);
    for (size_t i = 0; i < n * 2; i += 1024) churned[i]++;
}

/* Give the churn buffer's resident pages back (its contents do not matter), so that the pages
 * touched next are mapped into free room and nothing is evicted meanwhile. */
static void unchurn(void) {
    uintptr_t from = ((uintptr_t)churned + PIECE - 1) & ~(uintptr_t)(PIECE - 1);
    uintptr_t to = ((uintptr_t)churned + n * 2) & ~(uintptr_t)(PIECE - 1);
    if (madvise((void *)from, to - from, MADV_DONTNEED) != 0) {
        fprintf(stderr, "madvise of the churn buffer: %s\n", strerror(errno));
        exit(1);
    }
}

#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); failures++; } while (0)

/* [p, p+len) must hold the pattern, except the zero ranges listed in z (pairs of offsets). */
static void expect(const char *what, const unsigned char *p, size_t len, unsigned seed,
                   const size_t *z, int nz) {
    for (size_t i = 0; i < len; i++) {
        int zero = 0;
        for (int k = 0; k < nz; k++) zero |= i >= z[2 * k] && i < z[2 * k + 1];
        unsigned char want = zero ? 0 : pattern(i, seed);
        if (p[i] != want) {
            FAIL("%s: byte %zu is %u, want %u", what, i, p[i], want);
            return;
        }
    }
}

/* madvise through the C library (or the raw system call) on a buffer partly evicted. The
 * ranges start and end inside 16 KiB pages and cover whole ones, resident and evicted. */
static void dontneed(int raw) {
    unsigned char *p = malloc(n);
    fill(p, n, 1);
    churn();
    size_t z[] = {3 * PIECE, 13 * PIECE, 17 * PIECE, 18 * PIECE, n / 2, n / 2 + 64 * 1024};
    int nz = 3;
    if (raw) {
        /* A raw system call reaches the kernel only: rmem sees what it did to the pages that
         * are resident (on an evicted one it is not seen at all: README). Make them so (the
         * first four clean, the rest dirty) right before, into room made first: with the
         * budget full of the churn buffer, the faults' evictions (in address order from the
         * previous victim) could take the first of them again before the call (a README
         * suite failed once: "byte 12288 is 151, want 0"). */
        nz = 2;
        unchurn();
        for (size_t i = 0; i < 8 * PIECE; i++) (void)*(volatile unsigned char *)&p[i];
        for (size_t i = 8 * PIECE; i < 20 * PIECE; i++) p[i] = pattern(i, 1);
        for (int k = 0; k < nz; k++)
            if (syscall(SYS_madvise, p + z[2 * k], z[2 * k + 1] - z[2 * k], MADV_DONTNEED) != 0)
                FAIL("raw madvise: %s", strerror(errno));
    } else {
        for (int k = 0; k < nz; k++)
            if (madvise(p + z[2 * k], z[2 * k + 1] - z[2 * k], MADV_DONTNEED) != 0)
                FAIL("madvise: %s", strerror(errno));
    }
    expect("after MADV_DONTNEED", p, n, 1, z, nz);
    /* The zeroed ranges are memory like any other: written, evicted, read back. */
    fill(p, n, 2);
    churn();
    expect("written after MADV_DONTNEED, evicted", p, n, 2, NULL, 0);
    if (madvise(p + 1, PIECE, MADV_DONTNEED) == 0 || errno != EINVAL)
        FAIL("madvise at an unaligned address must fail with EINVAL");
    free(p);
}

/* MADV_FREE: Linux may keep each page or give zeros until it is written again; rmem frees the
 * whole pages at once (zeros) and keeps the parts of pages at the ends. */
static void lazy_free(void) {
    unsigned char *p = malloc(n);
    fill(p, n, 3);
    churn();
    size_t from = PIECE, to = 2 * 16384 + PIECE; /* page 0 in part, page 1 whole, page 2 in part */
    if (madvise(p + from, to - from, MADV_FREE) != 0) FAIL("madvise(MADV_FREE): %s", strerror(errno));
    for (size_t i = from; i < to; i++) {
        if (p[i] != 0 && p[i] != pattern(i, 3)) { FAIL("MADV_FREE: byte %zu is %u", i, p[i]); break; }
    }
    size_t z[] = {16384, 2 * 16384};
    expect("after MADV_FREE (the whole page freed)", p, n, 3, z, 1);
    fill(p, n, 4);
    churn();
    expect("written after MADV_FREE, evicted", p, n, 4, NULL, 0);
    free(p);
}

#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif

/* MADV_FREE by the raw system call on resident clean and dirty pages, then MADV_PAGEOUT so
 * that the kernel really frees them: what it freed reads as zero, the rest as before, piece
 * by piece; afterwards the memory is usable as any other. */
static void raw_lazy_free(void) {
    unsigned char *p = malloc(n);
    fill(p, n, 13);
    churn();
    size_t from = 3 * PIECE, to = 14 * PIECE;
    for (size_t i = 0; i < 8 * PIECE; i++) (void)*(volatile unsigned char *)&p[i]; /* clean */
    for (size_t i = 8 * PIECE; i < 16 * PIECE; i++) p[i] = pattern(i, 13);         /* dirty */
    if (syscall(SYS_madvise, p + from, to - from, MADV_FREE) != 0) FAIL("raw MADV_FREE: %s", strerror(errno));
    /* Refused on old kernels; then the kernel frees nothing, which MADV_FREE allows. */
    (void)syscall(SYS_madvise, p + from, to - from, MADV_PAGEOUT);
    size_t zeroed = 0;
    for (size_t k = from / PIECE; k < to / PIECE; k++) {
        int zero = p[k * PIECE] == 0;
        zeroed += zero;
        for (size_t i = k * PIECE; i < (k + 1) * PIECE; i++)
            if (p[i] != (zero ? 0 : pattern(i, 13))) { FAIL("raw MADV_FREE: byte %zu is %u", i, p[i]); k = to; break; }
    }
    for (size_t i = 0; i < n; i++)
        if ((i < from || i >= to) && p[i] != pattern(i, 13)) { FAIL("raw MADV_FREE: byte %zu outside changed", i); break; }
    printf("raw MADV_FREE: %zu of %zu pieces freed\n", zeroed, (to - from) / PIECE);
    fill(p, n, 14);
    churn();
    expect("written after a raw MADV_FREE, evicted", p, n, 14, NULL, 0);
    free(p);
}

/* munmap of the tail of a malloc'ed block: the head keeps its data, the tail's memory is
 * freed, and the block can still be freed. */
static void unmap_tail(void) {
    unsigned char *p = malloc(n);
    fill(p, n, 5);
    churn();
    if (munmap(p + n / 2, n / 2) != 0) FAIL("munmap of the tail: %s", strerror(errno));
    unsigned char *q = malloc(n / 2);
    fill(q, n / 2, 6);
    churn();
    expect("head after munmap of the tail", p, n / 2, 5, NULL, 0);
    expect("a new block after munmap of a tail", q, n / 2, 6, NULL, 0);
    free(q);
    free(p);
    if (munmap(p + 1, PIECE) == 0 || errno != EINVAL) FAIL("munmap unaligned must fail with EINVAL");
}

/* mremap: grown by moving (the old data there, the new part zero), shrunk in place. */
static void remap(void) {
    unsigned char *p = malloc(n);
    fill(p, n, 7);
    churn();
    if (mremap(p, n, 2 * n, 0) != MAP_FAILED || errno != ENOMEM)
        FAIL("growing without MREMAP_MAYMOVE must fail with ENOMEM");
    unsigned char *q = mremap(p, n, 2 * n, MREMAP_MAYMOVE);
    if (q == MAP_FAILED) { FAIL("mremap grow: %s", strerror(errno)); return; }
    size_t z[] = {n, 2 * n};
    expect("grown by mremap", q, 2 * n, 7, z, 1);
    fill(q, 2 * n, 8);
    churn();
    expect("grown, written, evicted", q, 2 * n, 8, NULL, 0);
    unsigned char *r = mremap(q, 2 * n, n / 2, 0);
    if (r != q) { FAIL("mremap shrink moved or failed: %s", strerror(errno)); return; }
    churn();
    expect("shrunk by mremap, evicted", q, n / 2, 8, NULL, 0);
    if (munmap(q, n / 2) != 0) FAIL("munmap of the moved block: %s", strerror(errno));
}

/* mprotect: the program's own SIGSEGV handler catches a write to a read-only page and any
 * access to an inaccessible one, with the address, before and after the pages were evicted
 * (dirty ones written back) and fetched again; the data stays. */
static sigjmp_buf jump;
static void *volatile fault_addr;

static void on_segv(int sig, siginfo_t *si, void *ctx) {
    (void)sig; (void)ctx;
    fault_addr = si->si_addr;
    siglongjmp(jump, 1);
}

/* 1 if the access faulted at `at` (the write stores `v`). */
static int faults(unsigned char *at, int write, unsigned char v) {
    fault_addr = NULL;
    if (sigsetjmp(jump, 1) == 0) {
        if (write) *(volatile unsigned char *)at = v;
        else (void)*(volatile unsigned char *)at;
        return 0;
    }
    if (fault_addr != at) FAIL("SIGSEGV at %p, want %p", fault_addr, (void *)at);
    return 1;
}

static void protect(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
    unsigned char *p = malloc(n);
    fill(p, n, 9); /* every page dirty */
    /* Read-only from the middle of a 16 KiB page over whole ones; one piece inaccessible. */
    size_t ro = 3 * PIECE, ro_end = 13 * PIECE, no = 20 * PIECE;
    if (mprotect(p + ro, ro_end - ro, PROT_READ) != 0) FAIL("mprotect read-only: %s", strerror(errno));
    if (mprotect(p + no, PIECE, PROT_NONE) != 0) FAIL("mprotect none: %s", strerror(errno));
    for (int round = 0; round < 2; round++) {
        /* Round 0: the pages are resident (and dirty); round 1: evicted and fetched again. */
        if (!faults(p + 5 * PIECE + 3, 1, 0)) FAIL("round %d: write to a read-only page did not fault", round);
        if (!faults(p + ro, 1, 0)) FAIL("round %d: write at the start of the read-only range did not fault", round);
        if (faults(p + ro - 1, 1, pattern(ro - 1, 9))) FAIL("round %d: write before the read-only range faulted", round);
        if (!faults(p + no + 9, 0, 0)) FAIL("round %d: read of an inaccessible page did not fault", round);
        if (faults(p + no + PIECE, 0, 0)) FAIL("round %d: read after the inaccessible page faulted", round);
        /* Reads of the read-only range work and see the data. */
        for (size_t i = 0; i < no; i++)
            if (p[i] != pattern(i, 9)) { FAIL("round %d: byte %zu changed", round, i); break; }
        churn();
    }
    if (mprotect(p + no, PIECE, PROT_READ | PROT_WRITE) != 0) FAIL("mprotect back: %s", strerror(errno));
    if (mprotect(p + ro, ro_end - ro, PROT_READ | PROT_WRITE) != 0) FAIL("mprotect back: %s", strerror(errno));
    expect("after mprotect, evictions and mprotect back", p, n, 9, NULL, 0);
    fill(p, n, 10);
    churn();
    expect("written after mprotect back, evicted", p, n, 10, NULL, 0);
    /* Memory freed while read-only is read-write when malloc hands it out again. */
    if (mprotect(p, n, PROT_READ) != 0) FAIL("mprotect whole: %s", strerror(errno));
    free(p);
    unsigned char *q = malloc(n);
    if (faults(q, 1, 1)) FAIL("memory freed read-only came back read-only");
    free(q);
    signal(SIGSEGV, SIG_DFL);
}

/* Pieces of [p, p+len) resident now (mincore). */
static size_t resident(unsigned char *p, size_t len) {
    unsigned char v[4096];
    size_t pieces = len / PIECE, k = 0;
    if (pieces > sizeof v || mincore(p, len, v) != 0) { FAIL("mincore: %s", strerror(errno)); return 0; }
    for (size_t i = 0; i < pieces; i++) k += v[i] & 1;
    return k;
}

/* mlock: pinned pages stay resident through evictions of everything else; pinning more than
 * the budget fails with ENOMEM and pins nothing; munlock makes them evictable again. */
static void lock(void) {
    size_t pinned = 256 * 1024; /* a quarter of the 1 MiB budget */
    unsigned char *p = malloc(n);
    fill(p, n, 11);
    churn();
    if (mlock(p, pinned) != 0) FAIL("mlock within the budget: %s", strerror(errno));
    for (int round = 0; round < 3; round++) {
        churn();
        if (resident(p, pinned) != pinned / PIECE)
            FAIL("round %d: %zu of %zu pinned pieces resident", round, resident(p, pinned), pinned / PIECE);
    }
    expect("pinned", p, pinned, 11, NULL, 0);
    /* Writes to pinned pages stay, and so does the pin. */
    fill(p, pinned, 12);
    churn();
    if (resident(p, pinned) != pinned / PIECE) FAIL("written pinned pages were evicted");
    expect("pinned, written", p, pinned, 12, NULL, 0);
    if (mlock(p, n) == 0 || errno != ENOMEM) FAIL("mlock beyond the budget must fail with ENOMEM");
    churn();
    if (resident(p + pinned, n - pinned) == (n - pinned) / PIECE) FAIL("a refused mlock pinned pages");
    if (mlockall(MCL_CURRENT) == 0 || errno != ENOMEM) FAIL("mlockall beyond the budget must fail with ENOMEM");
    if (munlock(p, pinned) != 0) FAIL("munlock: %s", strerror(errno));
    churn();
    if (resident(p, pinned) == pinned / PIECE) FAIL("unpinned pages were never evicted");
    expect("unpinned, evicted", p, pinned, 12, NULL, 0);
    /* MLOCK_ONFAULT pins pages as they are touched. */
    if (mlock2(p, pinned, MLOCK_ONFAULT) != 0) FAIL("mlock2: %s", strerror(errno));
    expect("touched after mlock2(MLOCK_ONFAULT)", p, pinned, 12, NULL, 0);
    churn();
    if (resident(p, pinned) != pinned / PIECE) FAIL("pages pinned on fault were evicted");
    if (munlockall() != 0) FAIL("munlockall: %s", strerror(errno));
    churn();
    if (resident(p, pinned) == pinned / PIECE) FAIL("pages stayed pinned after munlockall");
    /* Pinning an inaccessible page makes it resident without touching it (no SIGSEGV). */
    if (mprotect(p, 16384, PROT_NONE) != 0) FAIL("mprotect: %s", strerror(errno));
    if (mlock(p, 16384) != 0) FAIL("mlock of an inaccessible page: %s", strerror(errno));
    churn();
    if (resident(p, 16384) != 16384 / PIECE) FAIL("a pinned inaccessible page was evicted");
    if (mprotect(p, 16384, PROT_READ | PROT_WRITE) != 0 || munlock(p, 16384) != 0) FAIL("mprotect/munlock back");
    expect("pinned while inaccessible", p, pinned, 12, NULL, 0);
    free(p);
}

/* Stacks in remote memory: threads on malloc'ed stacks (one big, whose top only can be
 * pinned, and small ones) making system calls with buffers on their stacks and taking
 * signals there, and an alternate signal stack, all while everything else is evicted. The
 * kernel writes signal frames and each thread's control block (rseq, the thread id cleared
 * at exit) itself: unprivileged, that once killed the program with SIGSEGV. */
static _Atomic int handled;
static char *alt_lo, *alt_hi;

static void on_signal(int sig) {
    volatile char buf[1024];
    memset((char *)buf, sig, sizeof buf);
    if (sig == SIGUSR1 && ((char *)buf < alt_lo || (char *)buf >= alt_hi)) FAIL("handler not on the alternate stack");
    if (buf[sizeof buf - 1] == sig) handled++;
}

static long deep(int d) {
    volatile char a[512];
    a[0] = (char)d;
    if (d == 0) { churn(); return 0; }
    return deep(d - 1) + a[0];
}

static void *stack_worker(void *arg) {
    (void)arg;
    char buf[4096];
    int fd = open("/dev/zero", O_RDONLY);
    for (int r = 0; r < 10; r++) {
        memset(buf, 1, sizeof buf);
        churn();
        if (read(fd, buf, sizeof buf) != (ssize_t)sizeof buf || buf[100] != 0) FAIL("read into a stack buffer");
        struct timespec ts = {0, 1000};
        churn();
        if (nanosleep(&ts, NULL) != 0 && errno != EINTR) FAIL("nanosleep with its argument on the stack: %s", strerror(errno));
        if (deep(100) != 5050) FAIL("deep recursion lost data");
    }
    close(fd);
    return arg;
}

static void stacks(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_ONSTACK;
    sigaction(SIGUSR1, &sa, NULL);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR2, &sa, NULL);
    size_t alt = 64 * 1024;
    stack_t ss = {.ss_sp = malloc(alt), .ss_size = alt, .ss_flags = 0};
    alt_lo = ss.ss_sp;
    alt_hi = alt_lo + alt;
    if (sigaltstack(&ss, NULL) != 0) FAIL("sigaltstack: %s", strerror(errno));
    for (int i = 0; i < 5; i++) { churn(); raise(SIGUSR1); }
    if (handled != 5) FAIL("%d of 5 signals handled on the alternate stack", handled);
    enum { THREADS = 4 };
    size_t sizes[THREADS] = {n / 2, 64 * 1024, 64 * 1024, 128 * 1024};
    pthread_t t[THREADS];
    void *mem[THREADS];
    for (long i = 0; i < THREADS; i++) {
        pthread_attr_t a;
        pthread_attr_init(&a);
        mem[i] = malloc(sizes[i]);
        if (pthread_attr_setstack(&a, mem[i], sizes[i]) != 0) FAIL("pthread_attr_setstack");
        if (pthread_create(&t[i], &a, stack_worker, (void *)i) != 0) FAIL("pthread_create");
        pthread_attr_destroy(&a);
    }
    int sent = 0;
    for (int k = 0; k < 20; k++) {
        for (int i = 0; i < THREADS; i++)
            if (pthread_kill(t[i], SIGUSR2) == 0) sent++;
        churn();
    }
    for (long i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        if (r != (void *)i) FAIL("thread %ld returned %p", i, r);
        free(mem[i]);
    }
    if (handled < 5 + 1) FAIL("no signal handled on a thread stack (%d sent)", sent);
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: memcalls CASE MIB\n"); return 2; }
    n = (size_t)atol(argv[2]) << 20;
    const char *c = argv[1];
    if (!strcmp(c, "madvise")) dontneed(0);
    else if (!strcmp(c, "raw-madvise")) dontneed(1);
    else if (!strcmp(c, "free")) lazy_free();
    else if (!strcmp(c, "raw-free")) raw_lazy_free();
    else if (!strcmp(c, "munmap")) unmap_tail();
    else if (!strcmp(c, "mremap")) remap();
    else if (!strcmp(c, "mprotect")) protect();
    else if (!strcmp(c, "mlock")) lock();
    else if (!strcmp(c, "stacks")) stacks();
    else { fprintf(stderr, "unknown case %s\n", c); return 2; }
    if (failures) return 1;
    printf("memcalls %s: ok\n", c);
    return 0;
}
