/* Capacity: allocating beyond the servers' total capacity returns NULL with ENOMEM, and
 * allocations within it still work.   capacity TOO_BIG_MIB OK_MIB */
#include <errno.h>
#include <rmem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    size_t big = (size_t)atol(argv[1]) << 20, ok = (size_t)atol(argv[2]) << 20;
    errno = 0;
    char *p = rmem_alloc(big);
    if (p != NULL || errno != ENOMEM) {
        fprintf(stderr, "capacity: %zu MiB should not fit (p=%p errno=%d)\n", big >> 20, (void *)p, errno);
        return 1;
    }
    char *q = rmem_alloc(ok);
    if (!q) {
        fprintf(stderr, "capacity: %zu MiB should fit\n", ok >> 20);
        return 1;
    }
    memset(q, 0x5a, ok);
    for (size_t i = 0; i < ok; i += 4096)
        if (q[i] != 0x5a) return 1;
    rmem_free(q);
    printf("capacity: ok\n");
    rmem_exit();
    return 0;
}
