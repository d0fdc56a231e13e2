/* Hog: a node's own program that wants its memory back. Allocates MIB MiB of ordinary memory
 * and writes every page (so the kernel charges it), says "hog: MIB MiB" on stdout, then holds
 * it until stdin reaches EOF.
 *
 *   hog MIB */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: hog MIB\n");
        return 2;
    }
    size_t bytes = (size_t)atol(argv[1]) << 20;
    char *p = malloc(bytes);
    if (!p) {
        fprintf(stderr, "hog: cannot allocate %zu bytes\n", bytes);
        return 1;
    }
    memset(p, 0x5A, bytes);
    printf("hog: %zu MiB\n", bytes >> 20);
    fflush(stdout);
    char buf[256];
    while (read(0, buf, sizeof buf) > 0) {
    }
    /* Read it back so the compiler cannot drop the memset. */
    long sum = 0;
    for (size_t i = 0; i < bytes; i += 4096) sum += p[i];
    return sum == (long)(bytes / 4096) * 0x5A ? 0 : 1;
}
