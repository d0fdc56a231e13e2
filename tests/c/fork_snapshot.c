/* fork() children over a large remote array while the parent keeps writing it.
 *
 *   fork_snapshot MIB CHILDREN [exit]
 *
 * The parent fills MIB MiB (malloc: remote under `rmem run`) with generation 1 of a pattern
 * and forks CHILDREN children at once. Each child checks every word against generation 1 (the
 * parent's memory at the fork), writes its own generation (100 + its number) over all of it,
 * and checks that; it exits 0 with no mismatch (with _exit, or with exit when the third
 * argument is "exit", so that its exit handlers run). Meanwhile the parent writes generation 2, 3,
 * ... over the array, checking each pass, until every child has exited; then it checks the
 * last generation once more (the children's writes must not have reached it).
 * Prints "fork_snapshot: ok ..." and exits 0 when every process saw zero mismatches. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t pat(size_t w, uint64_t gen) { return (w * 0x9E3779B97F4A7C15ull) ^ (gen << 56) ^ gen; }

static void fill(uint64_t *a, size_t n, uint64_t gen) {
    for (size_t w = 0; w < n; w++) a[w] = pat(w, gen);
}

static size_t check(const uint64_t *a, size_t n, uint64_t gen, const char *who) {
    size_t bad = 0;
    for (size_t w = 0; w < n; w++)
        if (a[w] != pat(w, gen)) {
            if (bad < 3)
                fprintf(stderr, "fork_snapshot: %s: word %zu is %#llx, generation %llu has %#llx\n", who, w,
                        (unsigned long long)a[w], (unsigned long long)gen, (unsigned long long)pat(w, gen));
            bad++;
        }
    return bad;
}

int main(int argc, char **argv) {
    if (argc != 3 && !(argc == 4 && strcmp(argv[3], "exit") == 0)) {
        fprintf(stderr, "usage: fork_snapshot MIB CHILDREN [exit]\n");
        return 2;
    }
    int handlers = argc == 4;
    size_t n = ((size_t)atol(argv[1]) << 20) / 8;
    int children = atoi(argv[2]);
    uint64_t *a = malloc(n * 8);
    if (!a || children < 1 || children > 64) return 2;
    fill(a, n, 1);
    pid_t pid[64];
    for (int k = 0; k < children; k++) {
        pid[k] = fork();
        if (pid[k] < 0) { perror("fork"); return 1; }
        if (pid[k] == 0) {
            char who[32];
            snprintf(who, sizeof who, "child %d", k);
            size_t bad = check(a, n, 1, who);
            fill(a, n, 100 + (uint64_t)k);
            bad += check(a, n, 100 + (uint64_t)k, who);
            if (handlers) exit(bad ? 1 : 0);
            _exit(bad ? 1 : 0);
        }
    }
    uint64_t gen = 1;
    size_t bad = 0;
    int left = children, failed = 0;
    while (left > 0) {
        gen++;
        fill(a, n, gen);
        bad += check(a, n, gen, "parent");
        int st;
        pid_t c;
        while (left > 0 && (c = waitpid(-1, &st, WNOHANG)) > 0) {
            left--;
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                fprintf(stderr, "fork_snapshot: child %d ended with status %#x\n", (int)c, st);
                failed++;
            }
        }
    }
    bad += check(a, n, gen, "parent at the end");
    printf("fork_snapshot: %s mib=%zu children=%d failed=%d parent_mismatches=%zu parent_passes=%llu\n",
           bad || failed ? "FAILED" : "ok", n * 8 >> 20, children, failed, bad, (unsigned long long)gen - 1);
    return bad || failed ? 1 : 0;
}
