/* Kernel-mode access to remote memory: every buffer is a fresh malloc that lands in the rmem
 * region (transparent mode), and the I/O calls read into or write from it while it is not
 * resident. Checks the data of each call and prints "io: ok" or exits 1.
 *
 *   transparent_io DIR MIB      (MIB per buffer; run with a local budget of a few MiB) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <fcntl.h>

static size_t n;
static int failures;

static unsigned char *fresh(void) { return malloc(n); }

static void fill(unsigned char *p, unsigned seed) {
    unsigned x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) { x ^= x << 13; x ^= x >> 17; x ^= x << 5; p[i] = (unsigned char)x; }
}

static void check(const char *what, const unsigned char *a, const unsigned char *b, size_t len) {
    if (memcmp(a, b, len) != 0) { fprintf(stderr, "io: %s: data differs\n", what); failures++; }
}

/* Evict everything: touch a different buffer bigger than the budget. */
static void churn(void) {
    static unsigned char *c;
    if (!c) c = malloc(n * 2);
    for (size_t i = 0; i < n * 2; i += 4096) c[i]++;
}

static void full_read(int fd, unsigned char *p, size_t len, const char *what) {
    size_t got = 0;
    while (got < len) {
        ssize_t r = read(fd, p + got, len - got);
        if (r <= 0) { perror(what); failures++; return; }
        got += (size_t)r;
    }
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: transparent_io DIR MIB\n"); return 2; }
    n = (size_t)atol(argv[2]) << 20;
    char path[4096];
    snprintf(path, sizeof path, "%s/io.bin", argv[1]);
    unsigned char *src = fresh(), *dst;
    fill(src, 1);
    churn();

    /* write + read */
    int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0600);
    if (fd < 0 || write(fd, src, n) != (ssize_t)n) { perror("write"); return 1; }
    churn();
    dst = fresh();
    if (lseek(fd, 0, SEEK_SET) != 0) return 1;
    full_read(fd, dst, n, "read");
    check("write/read", src, dst, n);

    /* pwrite + pread */
    churn();
    if (pwrite(fd, src, n / 2, 4096) != (ssize_t)(n / 2)) { perror("pwrite"); failures++; }
    unsigned char *d2 = fresh();
    churn();
    if (pread(fd, d2, n / 2, 4096) != (ssize_t)(n / 2)) { perror("pread"); failures++; }
    check("pwrite/pread", src, d2, n / 2);

    /* writev + readv */
    churn();
    struct iovec wv[2] = {{src, n / 2}, {src + n / 2, n - n / 2}};
    if (lseek(fd, 0, SEEK_SET) != 0 || writev(fd, wv, 2) != (ssize_t)n) { perror("writev"); failures++; }
    unsigned char *d3 = fresh();
    churn();
    struct iovec rv[2] = {{d3, n / 3}, {d3 + n / 3, n - n / 3}};
    if (lseek(fd, 0, SEEK_SET) != 0 || readv(fd, rv, 2) != (ssize_t)n) { perror("readv"); failures++; }
    check("writev/readv", src, d3, n);
    close(fd);

    /* fwrite + fread */
    churn();
    FILE *f = fopen(path, "w+");
    if (!f || fwrite(src, 1, n, f) != n) { perror("fwrite"); failures++; }
    unsigned char *d4 = fresh();
    churn();
    rewind(f);
    if (fread(d4, 1, n, f) != n) { perror("fread"); failures++; }
    check("fwrite/fread", src, d4, n);
    fclose(f);

    /* send + recv over a socket pair, in pieces that fit the socket buffer */
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) { perror("socketpair"); return 1; }
    unsigned char *d5 = fresh();
    size_t piece = 64 << 10;
    for (size_t off = 0; off < n; off += piece) {
        size_t len = n - off < piece ? n - off : piece;
        churn();
        if (send(sv[0], src + off, len, 0) != (ssize_t)len) { perror("send"); failures++; break; }
        size_t got = 0;
        while (got < len) {
            ssize_t r = recv(sv[1], d5 + off + got, len - got, 0);
            if (r <= 0) { perror("recv"); failures++; break; }
            got += (size_t)r;
        }
        if (off == 0) {
            /* sendto/recvfrom on the same pair */
            if (sendto(sv[0], src, 4096, 0, NULL, 0) != 4096) { perror("sendto"); failures++; }
            unsigned char *d6 = fresh();
            churn();
            if (recvfrom(sv[1], d6, 4096, MSG_WAITALL, NULL, NULL) != 4096) { perror("recvfrom"); failures++; }
            check("sendto/recvfrom", src, d6, 4096);
        }
    }
    check("send/recv", src, d5, n);
    unlink(path);
    if (failures) return 1;
    printf("io: ok %zu MiB per buffer\n", n >> 20);
    return 0;
}
