/* Direct regions (rmem_read / rmem_write), run by crates/rmem-cli/tests/regions.rs.
 *
 *   regions stress SIZE SECONDS   8 threads, random unaligned ranges (single and lists) on
 *                                 stripes of their own, each against a reference copy; then
 *                                 the whole region read back against all of them
 *   regions bytes                 a 100-byte read moves about 100 bytes (statistics); bad
 *                                 input refused with errno and a message
 *   regions create NAME SIZE      a named region with a pattern; "ready" on stdout; waits for
 *                                 a line on stdin, then checks what the opener wrote
 *   regions open NAME             reads the pattern, writes its own mark, frees
 *   regions open-hold NAME        opens, prints "opened", waits for a line (its creator frees
 *                                 the region meanwhile), then fails with EIO
 *   regions open-fails NAME       rmem_region_open fails with ENOENT
 *   regions stress-open NAME SECONDS   the 8 threads' stress on a named region another
 *                                 process holds, past its first two pages (what the
 *                                 creator and `open` use)
 * Prints "ok" and exits 0 when every check passes; "FAIL ..." and exits 1 otherwise. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <rmem.h>

#define THREADS 8

static void fail(const char *what) {
    printf("FAIL %s: errno %d, %s\n", what, errno, rmem_last_error());
    fflush(stdout);
    exit(1);
}

static uint64_t rnd(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static unsigned char pattern(uint64_t at) { return (unsigned char)(at * 131 + 7); }

static uint64_t page_size;

struct worker {
    rmem_region_t *r;
    uint64_t base, len;     /* this thread's stripe */
    unsigned char *ref;     /* its reference copy */
    double seconds;
    uint64_t seed, ops, bytes;
    const char *error;
};

/* A random range inside the stripe: unaligned, up to three pages, often crossing one. */
static void pick(struct worker *w, uint64_t *off, size_t *len) {
    uint64_t max = w->len < 2 * page_size + 17 ? w->len : 2 * page_size + 17;
    *len = 1 + rnd(&w->seed) % max;
    *off = rnd(&w->seed) % (w->len - *len + 1);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void *work(void *arg) {
    struct worker *w = arg;
    unsigned char *buf = malloc(4 * (2 * page_size + 17)), *got = malloc(4 * (2 * page_size + 17));
    double end = now() + w->seconds;
    while (now() < end || w->ops < 200) {
        int kind = rnd(&w->seed) % 4;
        int n = kind >= 2 ? 1 + rnd(&w->seed) % 4 : 1; /* lists of up to 4 ranges */
        struct rmem_range rs[4];
        uint64_t off[4];
        size_t len[4], used = 0;
        for (int i = 0; i < n; i++) {
            pick(w, &off[i], &len[i]);
            if (kind % 2 == 0 && i > 0) {
                /* ranges of one write list must not overlap: their order is not defined */
                int clash = 0;
                for (int j = 0; j < i; j++)
                    if (off[i] < off[j] + len[j] && off[j] < off[i] + len[i]) clash = 1;
                if (clash) { n = i; break; }
            }
            rs[i].offset = w->base + off[i];
            rs[i].buf = buf + used;
            rs[i].len = len[i];
            used += len[i];
        }
        if (kind % 2 == 0) { /* write */
            for (size_t i = 0; i < used; i++) buf[i] = (unsigned char)rnd(&w->seed);
            ssize_t r = kind == 0 ? rmem_write(w->r, rs[0].offset, rs[0].buf, rs[0].len)
                                  : rmem_writev(w->r, rs, n);
            if (r != (ssize_t)(kind == 0 ? len[0] : used)) { w->error = "write"; break; }
            for (int i = 0; i < (kind == 0 ? 1 : n); i++) memcpy(w->ref + off[i], rs[i].buf, len[i]);
        } else { /* read */
            for (int i = 0; i < n; i++) rs[i].buf = got + (((unsigned char *)rs[i].buf) - buf);
            ssize_t r = kind == 1 ? rmem_read(w->r, rs[0].offset, rs[0].buf, rs[0].len)
                                  : rmem_readv(w->r, rs, n);
            if (r != (ssize_t)(kind == 1 ? len[0] : used)) { w->error = "read"; break; }
            for (int i = 0; i < (kind == 1 ? 1 : n); i++)
                if (memcmp(w->ref + off[i], rs[i].buf, len[i]) != 0) {
                    w->error = "a read differs from the reference copy";
                    break;
                }
            if (w->error) break;
        }
        w->ops++;
        w->bytes += used;
    }
    free(buf);
    free(got);
    return NULL;
}

/* The 8 threads on `r` from byte `from` to its end; what is there before is read first
 * (zeros in a new region, another process's bytes in an opened one). */
static int stress_on(rmem_region_t *r, uint64_t from, double seconds) {
    uint64_t size = rmem_region_size(r);
    struct rmem_region_stats st;
    if (rmem_region_get_stats(r, &st) != 0) fail("rmem_region_get_stats");
    page_size = st.page_size;
    unsigned char *ref = malloc(size);
    if (rmem_read(r, 0, ref, size) != (ssize_t)size) fail("rmem_read of what is there before");
    struct worker w[THREADS];
    pthread_t t[THREADS];
    /* Stripes of unaligned bounds: neighbours share pages, so pieces of one page are in
     * flight from two threads at once. */
    uint64_t stripe = (size - from) / THREADS;
    for (int i = 0; i < THREADS; i++) {
        uint64_t base = from + i * stripe + (i ? 1237 : 0);
        uint64_t end = i == THREADS - 1 ? size : from + (i + 1) * stripe + 1237;
        w[i] = (struct worker){r, base, end - base, ref + base, seconds, 0x9E3779B97F4A7C15ull + i, 0, 0, NULL};
        pthread_create(&t[i], NULL, work, &w[i]);
    }
    uint64_t ops = 0, bytes = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        if (w[i].error) { printf("FAIL thread %d: %s (%s)\n", i, w[i].error, rmem_last_error()); return 1; }
        ops += w[i].ops;
        bytes += w[i].bytes;
    }
    /* The whole region in one list of 1 MiB ranges, against every thread's copy. */
    unsigned char *all = malloc(size);
    size_t chunks = (size + (1 << 20) - 1) >> 20;
    struct rmem_range *rs = calloc(chunks, sizeof *rs);
    for (size_t i = 0; i < chunks; i++) {
        rs[i].offset = i << 20;
        rs[i].buf = all + (i << 20);
        rs[i].len = size - (i << 20) < (1 << 20) ? size - (i << 20) : (1 << 20);
    }
    if (rmem_readv(r, rs, chunks) != (ssize_t)size) fail("rmem_readv of the whole region");
    for (uint64_t i = 0; i < size; i++)
        if (all[i] != ref[i]) { printf("FAIL byte %llu is %d, not %d\n", (unsigned long long)i, all[i], ref[i]); return 1; }
    if (rmem_region_get_stats(r, &st) != 0) fail("rmem_region_get_stats");
    printf("ops %llu bytes %llu requests %llu fetched %llu sent %llu\n", (unsigned long long)ops,
           (unsigned long long)bytes, (unsigned long long)st.requests,
           (unsigned long long)st.bytes_fetched, (unsigned long long)st.bytes_sent);
    rmem_region_free(r);
    printf("ok\n");
    return 0;
}

static int stress(uint64_t size, double seconds) {
    rmem_region_t *r = rmem_region_create(size);
    if (!r) fail("rmem_region_create");
    if (rmem_region_size(r) != size) fail("rmem_region_size");
    return stress_on(r, 0, seconds);
}

static void expect_fail(ssize_t r, int err, const char *needle, const char *what) {
    if (r != -1 || errno != err || !strstr(rmem_last_error(), needle)) {
        printf("FAIL %s: returned %zd, errno %d (want %d), message \"%s\" (want \"%s\")\n", what, r,
               errno, err, rmem_last_error(), needle);
        exit(1);
    }
}

static int bytes(void) {
    rmem_region_t *r = rmem_region_create(1 << 20);
    if (!r) fail("rmem_region_create");
    unsigned char buf[300], back[300];
    for (int i = 0; i < 300; i++) buf[i] = pattern(i);
    struct rmem_region_stats a, b;
    rmem_region_get_stats(r, &a);
    uint64_t w = a.page_size - 51; /* across a page boundary, at an odd offset */
    if (rmem_write(r, w, buf, 300) != 300) fail("rmem_write");
    rmem_region_get_stats(r, &a);
    if (rmem_read(r, w + 25, back, 100) != 100) fail("rmem_read");
    rmem_region_get_stats(r, &b);
    if (memcmp(back, buf + 25, 100) != 0) { printf("FAIL the 100 bytes differ\n"); return 1; }
    uint64_t moved = b.bytes_fetched - a.bytes_fetched;
    printf("a 100-byte read moved %llu bytes in %llu requests (page %llu)\n",
           (unsigned long long)moved, (unsigned long long)(b.requests - a.requests),
           (unsigned long long)b.page_size);
    if (moved != 100 || b.requests - a.requests > 2 || b.bytes_read - a.bytes_read != 100) {
        printf("FAIL a 100-byte read moved %llu bytes\n", (unsigned long long)moved);
        return 1;
    }
    /* Never written: zeros; partly written: zeros around. */
    memset(back, 0xEE, sizeof back);
    if (rmem_read(r, w - 10, back, 20) != 20) fail("rmem_read of a partly written page");
    for (int i = 0; i < 20; i++)
        if (back[i] != (i < 10 ? 0 : buf[i - 10])) { printf("FAIL zeros around a write\n"); return 1; }
    if (rmem_read(r, (1 << 20) - 7, back, 7) != 7) fail("rmem_read of the last bytes");
    for (int i = 0; i < 7; i++) if (back[i]) { printf("FAIL an unwritten byte is not zero\n"); return 1; }
    /* Refused, with nothing moved. */
    expect_fail(rmem_read(r, 1 << 20, back, 1), EINVAL, "outside the region", "a read past the end");
    expect_fail(rmem_write(r, (1 << 20) - 5, buf, 6), EINVAL, "outside the region", "a write over the end");
    expect_fail(rmem_read(r, UINT64_MAX - 2, back, 10), EINVAL, "outside the region", "an offset that wraps");
    expect_fail(rmem_read(NULL, 0, back, 1), EINVAL, "region is NULL", "a NULL region");
    expect_fail(rmem_write(r, 0, NULL, 5), EINVAL, "buffer is NULL", "a NULL buffer");
    expect_fail(rmem_readv(r, NULL, 2), EINVAL, "list is NULL", "a NULL list");
    struct rmem_range rs[2] = {{0, back, 10}, {(1 << 20) - 1, back + 10, 2}};
    expect_fail(rmem_readv(r, rs, 2), EINVAL, "outside the region", "a list with a range past the end");
    if (rmem_read(r, 0, NULL, 0) != 0) fail("a read of 0 bytes");
    rmem_region_get_stats(r, &a);
    if (a.bytes_fetched != b.bytes_fetched + 20 + 7) { printf("FAIL refused calls moved bytes\n"); return 1; }
    if (rmem_region_create(0) != NULL || errno != EINVAL) { printf("FAIL a region of 0 bytes\n"); return 1; }
    if (rmem_region_create_named("../x", 10) != NULL || errno != EINVAL) { printf("FAIL a bad name\n"); return 1; }
    if (rmem_region_open(NULL) != NULL || errno != EINVAL) { printf("FAIL open(NULL)\n"); return 1; }
    if (rmem_region_get_stats(r, NULL) != -1 || errno != EINVAL) { printf("FAIL stats(NULL)\n"); return 1; }
    rmem_region_free(r);
    rmem_region_free(NULL);
    printf("ok\n");
    return 0;
}

static int create(const char *name, uint64_t size) {
    rmem_region_t *r = rmem_region_create_named(name, size);
    if (!r) fail("rmem_region_create_named");
    rmem_region_t *again = rmem_region_create_named(name, size);
    if (again || errno != EEXIST) { printf("FAIL a second region of the same name\n"); return 1; }
    unsigned char *buf = malloc(size);
    for (uint64_t i = 0; i < size; i++) buf[i] = pattern(i);
    if (rmem_write(r, 0, buf, size) != (ssize_t)size) fail("rmem_write of the pattern");
    printf("ready\n");
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) { printf("FAIL no word from the test\n"); return 1; }
    /* The opener wrote "opened" across the first page boundary. */
    char got[7] = {0};
    struct rmem_region_stats st;
    rmem_region_get_stats(r, &st);
    if (rmem_read(r, st.page_size - 3, got, 6) != 6) fail("rmem_read of the opener's mark");
    if (memcmp(got, "opened", 6) != 0) { printf("FAIL the opener's mark is \"%s\"\n", got); return 1; }
    rmem_region_free(r);
    printf("ok\n");
    return 0;
}

static int open_region(const char *name) {
    rmem_region_t *r = rmem_region_open(name);
    if (!r) fail("rmem_region_open");
    uint64_t size = rmem_region_size(r);
    unsigned char *buf = malloc(size);
    if (rmem_read(r, 0, buf, size) != (ssize_t)size) fail("rmem_read of the pattern");
    for (uint64_t i = 0; i < size; i++)
        if (buf[i] != pattern(i)) { printf("FAIL byte %llu of the creator's pattern\n", (unsigned long long)i); return 1; }
    struct rmem_region_stats st;
    rmem_region_get_stats(r, &st);
    if (rmem_write(r, st.page_size - 3, "opened", 6) != 6) fail("rmem_write of the mark");
    rmem_region_free(r);
    printf("ok %llu bytes\n", (unsigned long long)size);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 4 && !strcmp(argv[1], "stress")) return stress(strtoull(argv[2], 0, 0), atof(argv[3]));
    if (argc >= 2 && !strcmp(argv[1], "bytes")) return bytes();
    if (argc >= 4 && !strcmp(argv[1], "create")) return create(argv[2], strtoull(argv[3], 0, 0));
    if (argc >= 3 && !strcmp(argv[1], "open")) return open_region(argv[2]);
    if (argc >= 3 && !strcmp(argv[1], "open-hold")) {
        /* Open, say so, wait for a line (the creator frees meanwhile), then fail with EIO. */
        rmem_region_t *r = rmem_region_open(argv[2]);
        if (!r) fail("rmem_region_open");
        char c;
        if (rmem_read(r, 0, &c, 1) != 1 || c != (char)pattern(0)) fail("a read while held");
        printf("opened\n");
        char line[64];
        if (!fgets(line, sizeof line, stdin)) { printf("FAIL no word from the test\n"); return 1; }
        ssize_t n = rmem_read(r, 0, &c, 1);
        if (n != -1 || errno != EIO) { printf("FAIL a read after the creator freed it: %zd, errno %d\n", n, errno); return 1; }
        if (rmem_write(r, 0, &c, 1) != -1 || errno != EIO) { printf("FAIL a later write\n"); return 1; }
        rmem_region_free(r);
        printf("ok: %s\n", rmem_last_error());
        return 0;
    }
    if (argc >= 4 && !strcmp(argv[1], "stress-open")) {
        rmem_region_t *r = rmem_region_open(argv[2]);
        if (!r) fail("rmem_region_open");
        struct rmem_region_stats st;
        rmem_region_get_stats(r, &st);
        return stress_on(r, 2 * st.page_size, atof(argv[3]));
    }
    if (argc >= 3 && !strcmp(argv[1], "open-fails")) {
        rmem_region_t *r = rmem_region_open(argv[2]);
        if (r || errno != ENOENT) { printf("FAIL open of a freed region: errno %d\n", errno); return 1; }
        printf("ok: %s\n", rmem_last_error());
        return 0;
    }
    fprintf(stderr, "usage: regions stress SIZE SECONDS | bytes | create NAME SIZE | open NAME | stress-open NAME SECONDS | open-fails NAME\n");
    return 2;
}
