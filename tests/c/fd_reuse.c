/* A program that does to its descriptor table what daemons, shells and careless programs do,
 * while its data is in remote memory, then checks every byte.
 *
 *   fd_reuse MODE MIB
 *   MODE: dup2     dup2 a file onto every number from 3 to 511 and onto every descriptor
 *                  the process has that the program did not open (rmem's, if any), below
 *                  the open-file limit (above it dup2 fails with EBADF, rmem or not)
 *         range    close_range(3, ~0U, 0) through the C library
 *         closefrom closefrom(3)
 *         loop     close() every number from 3 up to sysconf(_SC_OPEN_MAX)
 *         raw      the close_range system call itself, then a free() (rmem must say its
 *                  descriptor was taken, never hand out zeros)
 * Prints "fds: ok" when all data read back intact. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define BLOCK (1 << 20)

static uint8_t expect(size_t block, size_t i, unsigned round) {
    return (uint8_t)(block * 131 + i * 7 + (i >> 12) + round * 29);
}

static void fill(uint8_t **b, size_t n, unsigned round) {
    for (size_t k = 0; k < n; k++)
        for (size_t i = 0; i < BLOCK; i++) b[k][i] = expect(k, i, round);
}

static void check(uint8_t **b, size_t n, unsigned round, const char *when) {
    size_t bad = 0;
    for (size_t k = 0; k < n; k++)
        for (size_t i = 0; i < BLOCK; i++)
            if (b[k][i] != expect(k, i, round)) bad++;
    if (bad) {
        fprintf(stderr, "fd_reuse: %zu of %zu bytes wrong %s\n", bad, n * (size_t)BLOCK, when);
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: fd_reuse dup2|range|closefrom|loop|raw MIB\n");
        return 2;
    }
    const char *mode = argv[1];
    size_t n = (size_t)atoi(argv[2]);
    uint8_t **b = calloc(n, sizeof *b);
    for (size_t k = 0; k < n; k++) b[k] = malloc(BLOCK);
    fill(b, n, 0);
    check(b, n, 0, "before");

    if (!strcmp(mode, "dup2")) {
        int z = open("/dev/zero", O_RDONLY);
        int targets[4096], nt = 0;
        struct rlimit lim;
        getrlimit(RLIMIT_NOFILE, &lim);
        DIR *d = opendir("/proc/self/fd");
        struct dirent *e;
        while ((e = readdir(d)) && nt < 2048) {
            int fd = atoi(e->d_name);
            if (fd > 2 && fd != z && fd != dirfd(d) && (rlim_t)fd < lim.rlim_cur) targets[nt++] = fd;
        }
        closedir(d);
        for (int fd = 3; fd < 512 && (rlim_t)fd < lim.rlim_cur; fd++) targets[nt++] = fd;
        for (int i = 0; i < nt; i++) {
            if (targets[i] != z && dup2(z, targets[i]) != targets[i]) {
                fprintf(stderr, "fd_reuse: dup2 onto %d: %s\n", targets[i], strerror(errno));
                return 1;
            }
        }
        /* The program got what it asked for: each number reads /dev/zero. */
        for (int i = 0; i < nt; i++) {
            int fd = targets[i];
            unsigned char c = 1;
            if (read(fd, &c, 1) != 1 || c != 0) {
                fprintf(stderr, "fd_reuse: descriptor %d is not /dev/zero\n", fd);
                return 1;
            }
        }
    } else if (!strcmp(mode, "range")) {
        if (close_range(3, ~0U, 0) != 0) {
            perror("fd_reuse: close_range");
            return 1;
        }
    } else if (!strcmp(mode, "closefrom")) {
        closefrom(3);
    } else if (!strcmp(mode, "loop")) {
        long max = sysconf(_SC_OPEN_MAX);
        for (long fd = 3; fd < max; fd++) close((int)fd);
    } else if (!strcmp(mode, "raw")) {
        syscall(SYS_close_range, 3, ~0U, 0);
    } else {
        fprintf(stderr, "fd_reuse: unknown mode %s\n", mode);
        return 2;
    }
    /* Nothing the program owns is left open above 2 (except in dup2 mode). */
    if (strcmp(mode, "dup2") && fcntl(3, F_GETFD) != -1) {
        fprintf(stderr, "fd_reuse: descriptor 3 still open after %s\n", mode);
        return 1;
    }

    check(b, n, 0, "after the descriptors were closed");
    fill(b, n, 1);
    check(b, n, 1, "after rewriting");
    for (size_t k = 0; k < n; k++) free(b[k]);
    for (size_t k = 0; k < n; k++) b[k] = malloc(BLOCK);
    fill(b, n, 2);
    check(b, n, 2, "in new blocks");
    printf("fds: ok\n");
    return 0;
}
