/* A fork() whose child rmem cannot serve fails at the call, and the program goes on.  With
 * every descriptor number under a lowered open-file limit taken, the pipe that tells the pager
 * when a child is gone cannot be made: fork() returns -1 with EAGAIN (no child is left
 * behind); with the descriptors closed and the limit restored, fork() works and the child
 * reads its parent's remote memory.  Prints "fork_refused: ok" or exits 1. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
    size_t n = 16 << 20;
    unsigned char *p = malloc(n);
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i % 253 + 1);
    struct rlimit old, low;
    getrlimit(RLIMIT_NOFILE, &old);
    low = old;
    low.rlim_cur = 64;
    if (setrlimit(RLIMIT_NOFILE, &low) != 0) { perror("setrlimit"); return 1; }
    int fds[64], nfds = 0;
    while (nfds < 64 && (fds[nfds] = dup(0)) >= 0) nfds++;
    if (errno != EMFILE) { perror("dup"); return 1; }
    pid_t c = fork();
    if (c == 0) _exit(9); /* must not happen: the child is refused before it returns here */
    if (c != -1 || errno != EAGAIN) {
        fprintf(stderr, "fork_refused: fork under the low limit gave %d errno %d\n", (int)c, errno);
        return 1;
    }
    int st;
    if (waitpid(-1, &st, WNOHANG) != -1 || errno != ECHILD) {
        fprintf(stderr, "fork_refused: a child was left behind\n");
        return 1;
    }
    printf("refused: EAGAIN\n");
    fflush(stdout);
    while (nfds > 0) close(fds[--nfds]);
    if (setrlimit(RLIMIT_NOFILE, &old) != 0) { perror("setrlimit"); return 1; }
    c = fork();
    if (c == 0) {
        for (size_t i = 0; i < n; i++)
            if (p[i] != (unsigned char)(i % 253 + 1)) _exit(3);
        _exit(0);
    }
    if (c < 0 || waitpid(c, &st, 0) != c || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "fork_refused: the fork after restoring the limit failed (%#x)\n", st);
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i % 253 + 1)) { fprintf(stderr, "fork_refused: parent data lost\n"); return 1; }
    printf("fork_refused: ok\n");
    return 0;
}
