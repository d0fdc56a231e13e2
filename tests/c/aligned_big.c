/* Large alignments (128 KiB to 2 MiB) through posix_memalign, aligned_alloc and memalign:
 * every block aligned as asked, its data intact after the others paged it out. Under
 * `rmem run --local` smaller than the total, the statistics show whether the blocks were
 * remote. Prints "aligned: ok" or exits 1. */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define KINDS 3
#define ALIGNS 5

int main(void) {
    unsigned char *p[KINDS][ALIGNS];
    size_t size[ALIGNS];
    for (int a = 0; a < ALIGNS; a++) {
        size_t align = (size_t)128 << 10 << a;
        size[a] = align + 12345;
        for (int k = 0; k < KINDS; k++) {
            void *q = NULL;
            if (k == 0 && posix_memalign(&q, align, size[a])) q = NULL;
            if (k == 1) q = aligned_alloc(align, size[a]);
            if (k == 2) q = memalign(align, size[a]);
            if (!q || (uintptr_t)q % align) {
                fprintf(stderr, "aligned: kind %d align %zu gave %p\n", k, align, q);
                return 1;
            }
            p[k][a] = q;
            for (size_t i = 0; i < size[a]; i++) p[k][a][i] = (unsigned char)(i * 7 + k + a);
        }
    }
    for (int a = 0; a < ALIGNS; a++)
        for (int k = 0; k < KINDS; k++) {
            for (size_t i = 0; i < size[a]; i++)
                if (p[k][a][i] != (unsigned char)(i * 7 + k + a)) {
                    fprintf(stderr, "aligned: kind %d align %d byte %zu wrong\n", k, a, i);
                    return 1;
                }
            free(p[k][a]);
        }
    printf("aligned: ok\n");
    return 0;
}
