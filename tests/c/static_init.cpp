// C++ static initializers allocate before main; the program closes stderr before it exits,
// as GNU coreutils do. Prints "static: ok SUM" and exits 0.
#include <cstdio>
#include <numeric>
#include <vector>

static std::vector<unsigned> big(8u << 20, 7u);  // 32 MiB, allocated before main

int main() {
    for (size_t i = 0; i < big.size(); i++) big[i] += (unsigned)(i % 13);
    unsigned long long s = std::accumulate(big.begin(), big.end(), 0ull);
    std::vector<std::vector<char>> many;
    for (int i = 0; i < 64; i++) many.emplace_back(1 << 20, (char)i);
    for (int i = 0; i < 64; i++) s += (unsigned char)many[i][12345];
    std::printf("static: ok %llu\n", s);
    std::fflush(stdout);
    std::fclose(stderr);
    return 0;
}
