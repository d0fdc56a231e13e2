/* A fork() child's memory on the servers, freed when the child is killed.
 *
 *   fork_kill MIB
 *
 * Linked with librmem and run with the runtime's environment (RMEM_SERVERS, ...): the parent
 * writes MIB MiB of remote memory (rmem_alloc) and forks a child, which writes its own
 * pattern over all of it (so that its snapshot holds pages of its own on the servers), prints
 * "child PID wrote" and sleeps until it is killed. The parent then prints "parent ready",
 * waits for its stdin to close, checks that its memory is its own pattern still and prints
 * "parent: ok". Exits 1 on a mismatch. */
#include <rmem.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: fork_kill MIB\n");
        return 2;
    }
    size_t n = (size_t)atol(argv[1]) << 20;
    unsigned char *p = rmem_alloc(n);
    if (!p) return 3;
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i / 4096 + 1);
    int done[2];
    if (pipe(done)) return 3;
    fflush(stdout);
    pid_t c = fork();
    if (c < 0) return 3;
    if (c == 0) {
        for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i / 4096 + 7);
        printf("child %d wrote\n", (int)getpid());
        fflush(stdout);
        if (write(done[1], "x", 1) != 1) _exit(3);
        for (;;) pause();
    }
    char b;
    if (read(done[0], &b, 1) != 1) return 3;
    printf("parent ready\n");
    fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {
    }
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i / 4096 + 1)) {
            fprintf(stderr, "fork_kill: parent's byte %zu changed\n", i);
            return 1;
        }
    printf("parent: ok\n");
    return 0;
}
