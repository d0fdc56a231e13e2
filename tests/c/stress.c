/* Stress: THREADS threads do random reads and writes with verification over a dlm_alloc'ed
 * region. Threads own interleaved words, so every page is shared by all threads and is
 * faulted, evicted and written back under them concurrently.
 *
 *   stress THREADS REGION_MIB OPS_PER_THREAD
 *
 * With STRESS_PAGEOUT_US=N in the environment, one more thread asks the kernel every N us to
 * page the whole region out to swap (MADV_PAGEOUT, by system call past librmem's madvise), so
 * that the pager moves, installs and drops pages the kernel is swapping at the same time.
 *
 * With STRESS_FORKS=N, the main thread forks N children while the workers run (pages in
 * flight both ways). Each child checks the region against its copy of the shadow: a word a
 * worker was writing at the instant of the fork may differ (at most one per worker: its
 * region store and its shadow store straddle the fork), nothing else. It then runs its own
 * single-threaded verified reads and writes, and checks every word again: zero mismatches.
 *
 * With STRESS_UNTIL=PATH, the workers go on past OPS_PER_THREAD until the file PATH exists (a
 * test that needs the program running through several phases says when it may end).
 *
 * Prints "stress: ok ..." and exits 0 with zero mismatches; exits 1 on any mismatch. */
#include <dlm.h>
#include <rmem.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static volatile uint64_t *mem;
static uint64_t *shadow;
static size_t words;
static int threads;
static long ops;
static long mismatches;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static volatile int done;
static long pageout_us;
static size_t region_bytes;
static const char *until;

#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif

static void *pageout(void *arg) {
    (void)arg;
    long calls = 0;
    while (!done) {
        syscall(SYS_madvise, (void *)mem, region_bytes, MADV_PAGEOUT);
        calls++;
        usleep((useconds_t)pageout_us);
    }
    fprintf(stderr, "stress: %ld page-out requests\n", calls);
    return NULL;
}

static uint64_t next(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void *worker(void *arg) {
    long t = (long)arg;
    uint64_t x = 0x9E3779B97F4A7C15ull ^ (uint64_t)(t + 1) * 0x100000001B3ull;
    size_t mine = (words - (size_t)t + (size_t)threads - 1) / (size_t)threads;
    long bad = 0;
    for (long i = 0; i < ops || (until && (i % 4096 != 0 || access(until, F_OK) != 0)); i++) {
        uint64_t r = next(&x);
        size_t w = (size_t)t + (size_t)(r % mine) * (size_t)threads;
        if (r & 1) {
            uint64_t v = next(&x);
            mem[w] = v;
            shadow[w] = v;
        } else if (mem[w] != shadow[w]) {
            if (bad < 5)
                fprintf(stderr, "stress: thread %ld word %zu: read %#llx expected %#llx\n", t, w,
                        (unsigned long long)mem[w], (unsigned long long)shadow[w]);
            bad++;
        }
    }
    for (size_t w = (size_t)t; w < words; w += (size_t)threads)
        if (mem[w] != shadow[w]) bad++;
    pthread_mutex_lock(&lock);
    mismatches += bad;
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* In a fork() child: the snapshot check and a verified run of the child's own. */
static int child_check(long k) {
    long straddling = 0, bad = 0;
    for (size_t w = 0; w < words; w++)
        if (mem[w] != shadow[w]) {
            straddling++;
            shadow[w] = mem[w];
        }
    uint64_t x = 0xD1B54A32D192ED03ull ^ (uint64_t)(k + 1);
    for (long i = 0; i < ops / 16; i++) {
        uint64_t r = next(&x);
        size_t w = (size_t)(r % words);
        if (r & 1) {
            uint64_t v = next(&x);
            mem[w] = v;
            shadow[w] = v;
        } else if (mem[w] != shadow[w]) {
            bad++;
        }
    }
    for (size_t w = 0; w < words; w++)
        if (mem[w] != shadow[w]) bad++;
    if (straddling > threads || bad)
        fprintf(stderr, "stress: fork child %ld: %ld words differ at the fork (at most %d may), %ld after\n", k,
                straddling, threads, bad);
    return straddling > threads || bad ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: stress THREADS REGION_MIB OPS_PER_THREAD\n");
        return 2;
    }
    threads = atoi(argv[1]);
    size_t bytes = (size_t)atol(argv[2]) << 20;
    ops = atol(argv[3]);
    if (dlm_init(&argc, &argv) != 0) return 3;
    words = bytes / 8;
    region_bytes = bytes;
    mem = dlm_alloc(bytes);
    shadow = calloc(words, 8);
    if (!mem || !shadow) {
        fprintf(stderr, "stress: allocation failed\n");
        return 3;
    }
    for (size_t w = 0; w < words; w += 4096 / 8)
        if (mem[w] != 0) {
            fprintf(stderr, "stress: fresh memory not zero at word %zu\n", w);
            return 1;
        }
    pthread_t tid[256];
    if (threads < 1 || threads > 256) return 2;
    until = getenv("STRESS_UNTIL");
    const char *po = getenv("STRESS_PAGEOUT_US");
    pthread_t pager_out;
    pageout_us = po ? atol(po) : 0;
    if (pageout_us > 0) pthread_create(&pager_out, NULL, pageout, NULL);
    for (long t = 0; t < threads; t++) pthread_create(&tid[t], NULL, worker, (void *)t);
    const char *fk = getenv("STRESS_FORKS");
    long forks = fk ? atol(fk) : 0, forks_failed = 0;
    for (long k = 0; k < forks; k++) {
        usleep(100000);
        pid_t c = fork();
        if (c < 0) { perror("fork"); return 1; }
        if (c == 0) _exit(child_check(k));
        int st;
        if (waitpid(c, &st, 0) != c || !WIFEXITED(st) || WEXITSTATUS(st) != 0) forks_failed++;
    }
    for (long t = 0; t < threads; t++) pthread_join(tid[t], NULL);
    if (forks_failed) {
        fprintf(stderr, "stress: %ld of %ld fork children failed\n", forks_failed, forks);
        mismatches += forks_failed;
    }
    done = 1;
    if (pageout_us > 0) pthread_join(pager_out, NULL);
    struct rmem_stats s;
    rmem_get_stats(&s);
    printf("stress: %s threads=%d region=%zu MiB mismatches=%ld swap_ins=%llu swap_outs=%llu "
           "zero_fills=%llu wp_faults=%llu page=%llu\n",
           mismatches ? "FAILED" : "ok", threads, bytes >> 20, mismatches,
           (unsigned long long)s.swap_ins, (unsigned long long)s.swap_outs,
           (unsigned long long)s.zero_fills, (unsigned long long)s.wp_faults,
           (unsigned long long)s.page_size);
    dlm_free((void *)mem);
    dlm_exit();
    return mismatches ? 1 : 0;
}
