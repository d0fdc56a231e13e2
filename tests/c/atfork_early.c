/* A library that keeps a mutex in remote memory and holds it across fork(), as jemalloc
 * holds its arenas' mutexes: its prepare handler locks it, its parent and child handlers
 * unlock it, and its child handler writes a counter in another remote block that nothing
 * touched before the fork (as jemalloc's resets its arenas' thread counts). Its constructor
 * registers the handlers before librmem's constructor runs (a library loaded after the
 * preloaded librmem is initialized first); the mutex is allocated later, remote. Built twice from this file: with -DLIB as a shared library, and as the
 * program linked to it; with -DMMAP and -DOWN_MALLOC, the library's blocks come from mmap
 * and the program defines malloc itself.
 * Usage: atfork_early MIB (MiB written before each fork, to push the mutex out of local
 * memory). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef LIB
#ifdef MMAP
#include <sys/mman.h>
/* Blocks from mmap: remote under rmem's --anon-mmap (for a program whose own malloc is not
 * rmem's, which OWN_MALLOC below makes it). */
static void *block(size_t n) {
    void *p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? 0 : p;
}
#else
static void *block(size_t n) { return malloc(n); }
#endif
struct state {
    pthread_mutex_t lock;
    unsigned prepared, parents;
    unsigned *children; /* in a block of its own, which only the child handler touches */
};
static struct state *st;
static void prepare(void) {
    if (st) { pthread_mutex_lock(&st->lock); st->prepared++; }
}
static void parent(void) {
    if (st) { st->parents++; pthread_mutex_unlock(&st->lock); }
}
static void child(void) {
    if (st) { (*st->children)++; pthread_mutex_unlock(&st->lock); }
}
__attribute__((constructor)) static void init(void) { pthread_atfork(prepare, parent, child); }
void atfork_state(void) {
    st = block(1 << 20);
    memset(st, 1, 1 << 20); /* not zeros: a page that leaves is written to a server */
    pthread_mutex_init(&st->lock, NULL);
    st->prepared = st->parents = 0;
    st->children = block(1 << 20);
    memset(st->children, 1, 1 << 20);
    *st->children = 0;
}
unsigned atfork_count(int i) {
    pthread_mutex_lock(&st->lock);
    unsigned n = i == 0 ? st->prepared : i == 1 ? st->parents : *st->children;
    pthread_mutex_unlock(&st->lock);
    return n;
}
#else
#ifdef OWN_MALLOC
/* The executable defines the malloc family, as a program with an allocator linked in
 * statically does (rustc and jemalloc): the C library's own allocations go to it, not to
 * rmem's interposers. It forwards to glibc. */
extern void *__libc_malloc(size_t), *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t), __libc_free(void *);
void *malloc(size_t n) { return __libc_malloc(n); }
void *calloc(size_t n, size_t m) { return __libc_calloc(n, m); }
void *realloc(void *p, size_t n) { return __libc_realloc(p, n); }
void free(void *p) { __libc_free(p); }
#include <sys/mman.h>
static char *big_block(size_t n) {
    void *p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? 0 : p;
}
static void big_free(char *p, size_t n) { munmap(p, n); }
#else
static char *big_block(size_t n) { return malloc(n); }
static void big_free(char *p, size_t n) { (void)n; free(p); }
#endif
void atfork_state(void);
unsigned atfork_count(int i);
int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 64;
    atfork_state();
    for (unsigned round = 0; round < 3; round++) {
        char *big = big_block(mib << 20);
        for (size_t i = 0; i < mib << 20; i += 4096) big[i] = (char)(1 + i / 4096 % 200);
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); return 1; }
        /* The child sees the counts of the instant of the fork, and its own child handler's. */
        if (pid == 0)
            _exit(atfork_count(0) == round + 1 && atfork_count(2) == 1 && big[4096] == 2 ? 0 : 3);
        int status;
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "child %u: status %d\n", round, status);
            return 1;
        }
        big_free(big, mib << 20);
    }
    printf("atfork_early: ok %u %u %u\n", atfork_count(0), atfork_count(1), atfork_count(2));
    return 0;
}
#endif
