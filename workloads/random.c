/* random: uniform random read-modify-write of 8-byte words (HPCC RandomAccess; the worst
 * case for paging). Second argument: updates (default: a sixteenth of the words).
 * Self-check as in HPCC: the same updates applied again (xor undoes itself) must leave every
 * word at its initial value. */
#include "wl.h"

static void update(uint64_t *t, size_t n, uint64_t updates) {
    uint64_t s = 0x2545f4914f6cdd1dull;
    for (uint64_t u = 0; u < updates; u++) {
        uint64_t r = wl_rand(&s);
        t[r % n] ^= r;
    }
}

int main(int argc, char **argv) {
    uint64_t updates = 0;
    size_t size = wl_args("random", argc, argv, &updates);
    size_t n = size / sizeof(uint64_t);
    if (updates == 0)
        updates = n / 16;
    uint64_t *t = wl_alloc(n * sizeof(uint64_t));

    double t0 = wl_now();
    for (size_t i = 0; i < n; i++)
        t[i] = wl_hash(i);
    update(t, n, updates);
    double secs = wl_now() - t0;

    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += t[i];
    update(t, n, updates);
    for (size_t i = 0; i < n; i++)
        if (t[i] != wl_hash(i))
            wl_fail("word %zu is %016llx, expected %016llx", i, (unsigned long long)t[i],
                    (unsigned long long)wl_hash(i));
    wl_ok(secs, sum);
    wl_free(t);
    return 0;
}
