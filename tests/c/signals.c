/* Programs with their own signal dispositions under `rmem run`.
 *
 * "fork": children made by _Fork() (no atfork handlers: rmem cannot follow them) that reset SIGSEGV to SIG_DFL (by signal(), by sigaction()), or
 * that catch their own NULL dereference with a handler inherited from the parent, then touch
 * the parent's remote memory: each must end with rmem's message and exit status 70.
 * "handlers": a SIGSEGV handler on an alternate signal stack catches NULL dereferences
 * (sigsetjmp/siglongjmp) and a SIGBUS handler catches an access past the end of a mapped
 * file, while the program pages through remote memory (with RMEM_FAULT_DELIVERY=signal its
 * faults arrive as SIGBUS too); sigaction() reports the program's own handlers back; a
 * SIGSEGV sent by raise() reaches the program's handler.
 * "raw-altstack" (run with --anon-mmap): threads take a signal stack as Go's runtime does, with
 * every signal blocked: the one the thread has, or else one from mmap set by a raw system call
 * that no C library wrapper sees (with --anon-mmap, remote memory). Each thread then pages
 * through more than the budget and takes SIGUSR1 on that stack, a few times. Unprivileged, a
 * remote signal stack killed the thread at its first signal (the kernel cannot fault it in).
 * Prints "signals: ok" or exits 1. */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MB (1u << 20)
static sigjmp_buf jump;
static volatile sig_atomic_t caught_sig, caught_code;
static void *volatile caught_addr;

static void catcher(int sig, siginfo_t *si, void *ctx) {
    (void)ctx;
    caught_sig = sig;
    caught_code = si->si_code;
    caught_addr = si->si_addr;
    siglongjmp(jump, 1);
}

static void install(int sig, int flags) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = catcher;
    sa.sa_flags = SA_SIGINFO | flags;
    sigemptyset(&sa.sa_mask);
    if (sigaction(sig, &sa, NULL)) { perror("sigaction"); exit(1); }
}

/* Touch all of p (n bytes) and check the pattern written by fill. */
static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i / 4096 + seed);
}
static int check(const unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i += 512)
        if (p[i] != (unsigned char)(i / 4096 + seed)) { fprintf(stderr, "signals: data wrong at %zu\n", i); return 1; }
    return 0;
}

/* A NULL dereference the program catches itself. */
static int own_segv(void) {
    caught_sig = 0;
    if (sigsetjmp(jump, 1) == 0) {
        int *volatile bad = (int *)16;
        *(volatile int *)bad = 1;
        return 1;
    }
    return caught_sig == SIGSEGV && caught_addr == (void *)16 ? 0 : 1;
}

static int run_child(unsigned char *p, int how) {
    /* _Fork: no atfork handler runs, so rmem cannot follow the child (a fork() child reads
     * its parent's memory: tests/c/fork_child.c). */
    pid_t c = _Fork();
    if (c == 0) {
        if (how == 0) signal(SIGSEGV, SIG_DFL);
        if (how == 1) {
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = SIG_DFL;
            sigaction(SIGSEGV, &sa, NULL);
            sigaction(SIGBUS, &sa, NULL);
        }
        if (how == 2 && own_segv()) _exit(5); /* the parent's handler, inherited */
        printf("child %d read %u\n", how, p[3 * MB]);
        _exit(4);
    }
    int st;
    waitpid(c, &st, 0);
    if (WIFSIGNALED(st)) return 1000 + WTERMSIG(st);
    return WEXITSTATUS(st);
}

static int handlers(unsigned char *p, size_t n) {
    static char altstack[64 * 1024];
    stack_t ss = { .ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0 };
    if (sigaltstack(&ss, NULL)) { perror("sigaltstack"); return 1; }
    install(SIGSEGV, SA_ONSTACK);
    install(SIGBUS, SA_ONSTACK);
    struct sigaction q;
    if (sigaction(SIGSEGV, NULL, &q) || q.sa_sigaction != catcher || sigaction(SIGBUS, NULL, &q) || q.sa_sigaction != catcher) {
        fprintf(stderr, "signals: sigaction does not report the program's handler\n");
        return 1;
    }
    /* A file of one page mapped as two: the second page raises SIGBUS (BUS_ADRERR). */
    char path[] = "/tmp/rmem-signals-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || ftruncate(fd, 4096)) { perror("file"); return 1; }
    unlink(path);
    char *m = mmap(NULL, 8192, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) { perror("mmap"); return 1; }
    for (int round = 0; round < 4; round++) {
        fill(p, n, round);
        if (own_segv()) { fprintf(stderr, "signals: NULL dereference not caught (round %d)\n", round); return 1; }
        caught_sig = 0;
        if (sigsetjmp(jump, 1) == 0) {
            volatile char c = m[4096 + 10];
            (void)c;
            fprintf(stderr, "signals: no SIGBUS past the end of the file\n");
            return 1;
        }
        if (caught_sig != SIGBUS || caught_addr != m + 4096 + 10) {
            fprintf(stderr, "signals: SIGBUS: got %d at %p\n", caught_sig, caught_addr);
            return 1;
        }
        if (check(p, n, round)) return 1;
    }
    caught_sig = 0;
    if (sigsetjmp(jump, 1) == 0) {
        raise(SIGSEGV);
        fprintf(stderr, "signals: raise(SIGSEGV) returned\n");
        return 1;
    }
    if (caught_sig != SIGSEGV || caught_code != SI_TKILL) {
        fprintf(stderr, "signals: raise(SIGSEGV) gave %d code %d\n", caught_sig, caught_code);
        return 1;
    }
    return 0;
}

static _Atomic int usr1;
static void on_usr1(int sig) { (void)sig; usr1++; }

/* One thread's part of "raw-altstack" over its own n bytes at p; 0 when all went well. */
static int raw_altstack(unsigned char *p, size_t n) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    stack_t cur;
    if (syscall(SYS_sigaltstack, NULL, &cur)) { perror("sigaltstack"); return 1; }
    if (cur.ss_flags & SS_DISABLE) {
        size_t len = 256 * 1024;
        void *s = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        stack_t ss = { .ss_sp = s, .ss_size = len, .ss_flags = 0 };
        if (s == MAP_FAILED || syscall(SYS_sigaltstack, &ss, NULL)) { perror("raw sigaltstack"); return 1; }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    for (int round = 0; round < 4; round++) {
        fill(p, n, round);
        int before = usr1;
        pthread_kill(pthread_self(), SIGUSR1);
        if (usr1 <= before) { fprintf(stderr, "signals: SIGUSR1 not handled\n"); return 1; }
        if (check(p, n, round)) return 1;
    }
    return 0;
}

static void *raw_altstack_thread(void *arg) {
    size_t n = 8 * MB;
    unsigned char *p = malloc(n);
    (void)arg;
    return (void *)(long)(!p || raw_altstack(p, n));
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    size_t n = 16 * MB;
    unsigned char *p = malloc(n);
    if (!p) return 1;
    fill(p, n, 1);
    if (strcmp(mode, "fork") == 0) {
        install(SIGSEGV, 0);
        int a = run_child(p, 0), b = run_child(p, 1), c = run_child(p, 2);
        printf("children: %d %d %d\n", a, b, c);
        if (a != 70 || b != 70 || c != 70) return 1;
        if (own_segv() || check(p, n, 1)) return 1;
    } else if (strcmp(mode, "handlers") == 0) {
        if (handlers(p, n)) return 1;
    } else if (strcmp(mode, "raw-altstack") == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_usr1;
        sa.sa_flags = SA_ONSTACK;
        sigaction(SIGUSR1, &sa, NULL);
        pthread_t t[2];
        for (int i = 0; i < 2; i++)
            if (pthread_create(&t[i], NULL, raw_altstack_thread, NULL)) return 1;
        long bad = raw_altstack(p, n);
        for (int i = 0; i < 2; i++) {
            void *r;
            pthread_join(t[i], &r);
            bad |= (long)r;
        }
        if (bad) return 1;
    } else {
        fprintf(stderr, "usage: signals fork|handlers|raw-altstack\n");
        return 2;
    }
    printf("signals: ok\n");
    return 0;
}
