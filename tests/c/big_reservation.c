/* A managed runtime's heap reserved as GHC's is: GIB GiB of inaccessible address space
 * (PROT_NONE, MAP_NORESERVE), of which the first MIB MiB are made accessible with mprotect,
 * written and read back.
 *
 *   big_reservation GIB MIB
 *
 * Prints "big_reservation ok" and exits 0 when every word read back is the one written. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: big_reservation GIB MIB\n");
        return 2;
    }
    size_t reserve = (size_t)atol(argv[1]) << 30, used = (size_t)atol(argv[2]) << 20;
    uint64_t *p = mmap(NULL, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED || used > reserve || mprotect(p, used, PROT_READ | PROT_WRITE) != 0) {
        perror("big_reservation");
        return 1;
    }
    size_t n = used / 8;
    for (size_t w = 0; w < n; w++) p[w] = w * 0x9E3779B97F4A7C15ull;
    for (size_t w = 0; w < n; w++)
        if (p[w] != w * 0x9E3779B97F4A7C15ull) {
            fprintf(stderr, "big_reservation: word %zu wrong\n", w);
            return 1;
        }
    printf("big_reservation ok\n");
    return 0;
}
