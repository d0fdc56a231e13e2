/* fork() and remote memory: fork+exec, system() and popen() work; a forked child reads its
 * parent's remote memory as at the fork and its writes stay its own (exit 0); a child made by
 * _Fork() (no atfork handlers: rmem cannot follow it) that touches remote memory is stopped
 * with a clear error, exit status 70 (never sees zeros); the parent's data is intact
 * afterwards.  Prints "fork: ok" or exits 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
    size_t n = 16 << 20;
    unsigned char *p = malloc(n);
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i % 251 + 1);
    if (system("echo system-ok") != 0) { fprintf(stderr, "fork: system failed\n"); return 1; }
    FILE *f = popen("echo popen-ok", "r");
    char line[64] = {0};
    if (!f || !fgets(line, sizeof line, f) || strcmp(line, "popen-ok\n") != 0) { fprintf(stderr, "fork: popen failed\n"); return 1; }
    pclose(f);
    pid_t c = fork();
    if (c == 0) {
        /* Allocations still work in the child, remote ones too. */
        char *q = malloc(1 << 20);
        memset(q, 1, 1 << 20);
        for (size_t i = 0; i < n; i++)
            if (p[i] != (unsigned char)(i % 251 + 1)) _exit(3);
        memset(p, 0, n); /* the child's own */
        for (size_t i = 0; i < n; i += 4096)
            if (p[i] != 0 || q[i % (1 << 20)] != 1) _exit(5);
        _exit(0);
    }
    int st;
    waitpid(c, &st, 0);
    printf("child exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    fflush(stdout);
    pid_t r = _Fork();
    if (r == 0) {
        unsigned v = p[12345]; /* no remote memory here: must not read as zero */
        _exit(v == 0 ? 3 : 4);
    }
    waitpid(r, &st, 0);
    printf("_Fork child exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i % 251 + 1)) { fprintf(stderr, "fork: parent data lost at %zu\n", i); return 1; }
    pid_t e = fork();
    if (e == 0) { execlp("true", "true", (char *)NULL); _exit(127); }
    waitpid(e, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { fprintf(stderr, "fork: fork+exec failed\n"); return 1; }
    printf("fork: ok\n");
    return 0;
}
