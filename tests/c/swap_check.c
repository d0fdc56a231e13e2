/* Fill MIB mebibytes page by page with a pattern of each page's index, then read every page
 * back twice; prints "ok PAGES" or the first page that differs, and exits 1. Run under a
 * memory limit smaller than MIB, it makes the kernel swap (tests/nbd.rs: swap on rmem nbd). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 64;
  size_t pages = mib * 256, words = 4096 / sizeof(uint64_t);
  uint64_t *m = malloc(pages * 4096);
  if (!m) {
    perror("malloc");
    return 2;
  }
  for (size_t p = 0; p < pages; p++)
    for (size_t w = 0; w < words; w++)
      m[p * words + w] = (p * 0x9e3779b97f4a7c15ull) ^ w;
  for (int pass = 0; pass < 2; pass++)
    for (size_t p = 0; p < pages; p++)
      for (size_t w = 0; w < words; w++)
        if (m[p * words + w] != ((p * 0x9e3779b97f4a7c15ull) ^ w)) {
          printf("page %zu word %zu differs (pass %d)\n", p, w, pass);
          return 1;
        }
  printf("ok %zu\n", pages);
  return 0;
}
