/* fork() and remote memory: fork+exec, system() and popen() work; a forked child that
 * touches remote memory without exec is stopped with a clear error (never sees zeros); the
 * parent's data is intact afterwards.  Prints "fork: ok" or exits 1. */
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
        /* Local allocations still work in the child. */
        char *q = malloc(1 << 20);
        memset(q, 1, 1 << 20);
        unsigned v = p[12345]; /* remote memory: must not read as zero */
        printf("child read %u\n", v);
        _exit(v == 0 ? 3 : 4);
    }
    int st;
    waitpid(c, &st, 0);
    printf("child exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i % 251 + 1)) { fprintf(stderr, "fork: parent data lost at %zu\n", i); return 1; }
    pid_t e = fork();
    if (e == 0) { execlp("true", "true", (char *)NULL); _exit(127); }
    waitpid(e, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { fprintf(stderr, "fork: fork+exec failed\n"); return 1; }
    printf("fork: ok\n");
    return 0;
}
