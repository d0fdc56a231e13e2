/* Receives 3000 messages of a SOCK_SEQPACKET socket pair and 3000 UDP datagrams on loopback
 * into remote buffers that are mostly not resident, through recv, recvfrom, recvmsg, read and
 * recvmmsg in turn, and checks that every message arrived once, whole and in order.
 * (Unprivileged, the kernel cannot fault those buffers in: a receive that takes a message and
 * then fails to copy it loses it.)  Prints "msgs: ok". */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define COUNT 3000
#define WINDOW 16
#define AREA (64u << 20)

static int tx, rx;
static atomic_int received;

static size_t msg_len(int i) { return 200 + (size_t)(i * 37) % 1200; }
static uint8_t msg_byte(int i, size_t k) { return (uint8_t)(i * 13 + k * 3 + 1); }

static void *sender(void *arg) {
    (void)arg;
    uint8_t buf[2048];
    for (int i = 0; i < COUNT; i++) {
        while (i - atomic_load(&received) >= WINDOW) usleep(50);
        size_t n = msg_len(i);
        memcpy(buf, &i, sizeof i);
        for (size_t k = sizeof i; k < n; k++) buf[k] = msg_byte(i, k);
        if (send(tx, buf, n, 0) != (ssize_t)n) {
            perror("msg_recv: send");
            exit(1);
        }
    }
    return NULL;
}

/* Where message i lands: spread over the area so that most targets are not resident. */
static uint8_t *slot(uint8_t *area, int i) {
    return area + ((size_t)i * 2654435761u % (AREA / 4096 - 1)) * 4096 + (size_t)(i % 7) * 300;
}

static ssize_t receive(int i, uint8_t *to) {
    switch (i % 5) {
    case 0: return recv(rx, to, 2048, 0);
    case 1: return recvfrom(rx, to, 2048, 0, NULL, NULL);
    case 2: {
        struct iovec iov[2] = {{to, 100}, {to + 100, 1948}};
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};
        return recvmsg(rx, &m, 0);
    }
    case 3: return read(rx, to, 2048);
    default: {
        struct iovec iov = {to, 2048};
        struct mmsghdr mm = {.msg_hdr = {.msg_iov = &iov, .msg_iovlen = 1}};
        int r = recvmmsg(rx, &mm, 1, 0, NULL);
        return r == 1 ? (ssize_t)mm.msg_len : -1;
    }
    }
}

static int run(const char *what, uint8_t *area) {
    pthread_t t;
    atomic_store(&received, 0);
    pthread_create(&t, NULL, sender, NULL);
    for (int i = 0; i < COUNT; i++) {
        uint8_t *to = slot(area, i);
        ssize_t r = receive(i, to);
        if (r != (ssize_t)msg_len(i)) {
            fprintf(stderr, "msg_recv %s: message %d: got %zd bytes, want %zu\n", what, i, r,
                    msg_len(i));
            return 1;
        }
        int seq;
        memcpy(&seq, to, sizeof seq);
        if (seq != i) {
            fprintf(stderr, "msg_recv %s: message %d arrived as %d (%d lost)\n", what, i, seq,
                    seq - i);
            return 1;
        }
        for (size_t k = sizeof i; k < (size_t)r; k++)
            if (to[k] != msg_byte(i, k)) {
                fprintf(stderr, "msg_recv %s: message %d byte %zu wrong\n", what, i, k);
                return 1;
            }
        atomic_fetch_add(&received, 1);
    }
    pthread_join(t, NULL);
    close(tx);
    close(rx);
    return 0;
}

int main(void) {
    uint8_t *area = malloc(AREA);
    memset(area, 0x5a, AREA); /* every page exists remotely; most are evicted */
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv)) {
        perror("msg_recv: socketpair");
        return 1;
    }
    tx = sv[0], rx = sv[1];
    if (run("seqpacket", area)) return 1;

    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    rx = socket(AF_INET, SOCK_DGRAM, 0);
    tx = socket(AF_INET, SOCK_DGRAM, 0);
    if (bind(rx, (struct sockaddr *)&a, sizeof a) || getsockname(rx, (struct sockaddr *)&a, &al) ||
        connect(tx, (struct sockaddr *)&a, sizeof a)) {
        perror("msg_recv: udp");
        return 1;
    }
    if (run("udp", area)) return 1;
    printf("msgs: ok\n");
    return 0;
}
