/* A library that keeps a mutex in remote memory and holds it across fork(), as jemalloc
 * holds its arenas' mutexes: its prepare handler locks it, its parent and child handlers
 * unlock it. Its constructor registers the handlers before librmem's constructor runs (a
 * library loaded after the preloaded librmem is initialized first); the mutex is allocated
 * later, remote. Built twice from this file: with -DLIB as a shared library, and as the
 * program linked to it.
 * Usage: atfork_early MIB (MiB written before each fork, to push the mutex out of local
 * memory). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef LIB
struct state {
    pthread_mutex_t lock;
    unsigned prepared, parents, children;
};
static struct state *st;
static void prepare(void) {
    if (st) { pthread_mutex_lock(&st->lock); st->prepared++; }
}
static void parent(void) {
    if (st) { st->parents++; pthread_mutex_unlock(&st->lock); }
}
static void child(void) {
    if (st) { st->children++; pthread_mutex_unlock(&st->lock); }
}
__attribute__((constructor)) static void init(void) { pthread_atfork(prepare, parent, child); }
void atfork_state(void) {
    st = malloc(1 << 20);
    memset(st, 1, 1 << 20); /* not zeros: a page that leaves is written to a server */
    pthread_mutex_init(&st->lock, NULL);
    st->prepared = st->parents = st->children = 0;
}
unsigned atfork_count(int i) {
    pthread_mutex_lock(&st->lock);
    unsigned n = i == 0 ? st->prepared : i == 1 ? st->parents : st->children;
    pthread_mutex_unlock(&st->lock);
    return n;
}
#else
void atfork_state(void);
unsigned atfork_count(int i);
int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 64;
    atfork_state();
    for (unsigned round = 0; round < 3; round++) {
        char *big = malloc(mib << 20);
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
        free(big);
    }
    printf("atfork_early: ok %u %u %u\n", atfork_count(0), atfork_count(1), atfork_count(2));
    return 0;
}
#endif
