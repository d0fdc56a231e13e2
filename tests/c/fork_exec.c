/* The cost of fork() followed by exec(), the common case (subprocess, system, popen).
 *
 *   fork_exec MIB N
 *
 * Writes MIB MiB of malloc'ed memory (remote under `rmem run`, resident when it fits the
 * budget), then N times each: fork() and the child execs /bin/true, the parent waits for it;
 * the same with LD_PRELOAD taken out of the child's environment (under `rmem run` the exec'd
 * program otherwise loads librmem, a cost of exec, not of fork: posix_spawn pays it too); and
 * posix_spawn. Each is timed from the call to the end of the wait.
 * Prints "fork_exec: fork_median_us=... fork_bare_median_us=... spawn_median_us=..." */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: fork_exec MIB N\n");
        return 2;
    }
    size_t bytes = (size_t)atol(argv[1]) << 20;
    int n = atoi(argv[2]);
    char *p = malloc(bytes ? bytes : 1);
    double *fork_us = malloc(n * sizeof(double)), *spawn_us = malloc(n * sizeof(double));
    double *bare_us = malloc(n * sizeof(double));
    size_t envs = 0;
    while (environ[envs]) envs++;
    char **bare = malloc((envs + 1) * sizeof(char *));
    if (!p || !fork_us || !spawn_us || !bare_us || !bare || n < 1) return 2;
    size_t k = 0;
    for (size_t i = 0; i < envs; i++)
        if (strncmp(environ[i], "LD_PRELOAD=", 11) != 0) bare[k++] = environ[i];
    bare[k] = NULL;
    memset(p, 1, bytes);
    char *args[] = {"true", NULL};
    for (int i = 0; i < n; i++) {
        for (int b = 0; b < 2; b++) {
            double t = now_us();
            pid_t c = fork();
            if (c == 0) {
                execve("/bin/true", args, b ? bare : environ);
                _exit(127);
            }
            int st;
            if (c < 0 || waitpid(c, &st, 0) != c || !WIFEXITED(st) || WEXITSTATUS(st)) {
                fprintf(stderr, "fork_exec: fork+exec failed\n");
                return 1;
            }
            (b ? bare_us : fork_us)[i] = now_us() - t;
        }
        double t = now_us();
        pid_t c;
        int st;
        if (posix_spawn(&c, "/bin/true", NULL, NULL, args, environ) || waitpid(c, &st, 0) != c || st) {
            fprintf(stderr, "fork_exec: posix_spawn failed\n");
            return 1;
        }
        spawn_us[i] = now_us() - t;
    }
    for (size_t i = 0; i < bytes; i += 4096)
        if (p[i] != 1) {
            fprintf(stderr, "fork_exec: memory changed at %zu\n", i);
            return 1;
        }
    qsort(fork_us, n, sizeof(double), cmp);
    qsort(spawn_us, n, sizeof(double), cmp);
    qsort(bare_us, n, sizeof(double), cmp);
    printf("fork_exec: fork_median_us=%.0f fork_p90_us=%.0f fork_bare_median_us=%.0f spawn_median_us=%.0f "
           "n=%d mib=%zu\n",
           fork_us[n / 2], fork_us[n * 9 / 10], bare_us[n / 2], spawn_us[n / 2], n, bytes >> 20);
    return 0;
}
