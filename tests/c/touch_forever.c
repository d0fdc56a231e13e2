/* Fills MIB of remote memory, then keeps reading and writing it for at most SECONDS.
 * A test kills a memory server meanwhile and expects rmem to stop this program.
 *   touch_forever MIB SECONDS */
#include <rmem.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    size_t bytes = (size_t)atol(argv[1]) << 20;
    int seconds = atoi(argv[2]);
    volatile uint64_t *m = rmem_alloc(bytes);
    if (!m) return 3;
    size_t words = bytes / 8;
    for (size_t i = 0; i < words; i += 512) m[i] = i;
    printf("touch_forever: filled\n");
    fflush(stdout);
    time_t end = time(NULL) + seconds;
    uint64_t sum = 0;
    while (time(NULL) < end)
        for (size_t i = 0; i < words; i += 512) {
            if (m[i] != i) {
                fprintf(stderr, "touch_forever: word %zu is %llu\n", i, (unsigned long long)m[i]);
                return 1;
            }
            sum += m[i];
        }
    printf("touch_forever: finished without interruption (%llu)\n", (unsigned long long)sum);
    return 0;
}
