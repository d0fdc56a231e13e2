/* System calls whose buffers lie in remote memory that is not resident, made the ways programs
 * make them: C library functions rmem does not wrap (getrandom, stat, open, poll, epoll_wait,
 * preadv, preadv2, pwritev, readlink, getcwd, select, wait4, nanosleep, futex through
 * pthread_cond_timedwait), raw syscall(2), stdio reading into a setvbuf buffer, execv with its
 * argument strings there, and io_uring_setup (refused with ENOSYS).  Unprivileged, each failed
 * with EFAULT before rmem trapped them.  Every buffer is checked to be non-resident (mincore)
 * just before its call, and every result is checked.  Prints "syscalls: ok" (and the exec'd
 * copy prints "syscalls: exec ok"). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define AREA (48u << 20)
#define SLOT (256u << 10)

static uint8_t *area, *churn_area;
static int next_slot;
static char self[4096];

#define CHECK(cond, ...)                                                                    \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "syscalls: %s:%d: ", __FILE__, __LINE__);                       \
            fprintf(stderr, __VA_ARGS__);                                                   \
            fprintf(stderr, " (errno %d: %s)\n", errno, strerror(errno));                   \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

/* A fresh slot of remote memory (its own pages). */
static void *slot(void) {
    CHECK((size_t)(next_slot + 1) * SLOT <= AREA, "out of slots");
    return area + (size_t)next_slot++ * SLOT;
}

/* Push everything else out of local memory. */
static void churn(void) {
    for (size_t i = 0; i < AREA; i += 4096) churn_area[i] += 1;
}

/* [p, p+n) has no resident page: a system call on it would meet a missing page. */
#define assert_evicted(p, n) assert_evicted_at(p, n, __LINE__)
static void assert_evicted_at(const void *p, size_t n, int line) {
    uintptr_t a = (uintptr_t)p & ~4095ul, e = ((uintptr_t)p + n + 4095) & ~4095ul;
    unsigned char v[1024];
    for (int tries = 0;; tries++) {
        CHECK(mincore((void *)a, e - a, v) == 0, "mincore");
        int any = 0;
        for (size_t k = 0; k < (e - a) / 4096; k++) any |= v[k] & 1;
        if (!any) return;
        CHECK(tries < 5, "the buffer of line %d is still resident after churning", line);
        churn();
    }
}

/* Copy `s` into remote memory and evict it. */
static char *remote_str(const char *s) {
    char *p = slot();
    strcpy(p, s);
    return p;
}

static struct timespec *remote_ts(long sec, long nsec) {
    struct timespec *t = slot();
    t->tv_sec = sec;
    t->tv_nsec = nsec;
    return t;
}

static pthread_mutex_t *lock;
static pthread_cond_t *cond;
static int *flag;

static void *waker(void *arg) {
    (void)arg;
    usleep(20000);
    pthread_mutex_lock(lock);
    *flag = 1;
    pthread_cond_signal(cond);
    pthread_mutex_unlock(lock);
    return NULL;
}

static void exec_check(int argc, char **argv) {
    CHECK(argc == 4 && strcmp(argv[2], "alpha") == 0 && strcmp(argv[3], "omega") == 0,
          "exec'd with the wrong arguments");
    printf("syscalls: exec ok\n");
    exit(0);
}

extern char **environ;

/* argv[0..3] for the exec'd copy, array and strings in remote memory. */
static char **remote_args(void) {
    char **args = slot();
    args[0] = remote_str(self);
    args[1] = remote_str("exec-check");
    args[2] = remote_str("alpha");
    args[3] = remote_str("omega");
    args[4] = NULL;
    return args;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "exec-check") == 0) exec_check(argc, argv);
    int unprivileged = argc > 1 && strcmp(argv[1], "unprivileged") == 0;
    CHECK(readlink("/proc/self/exe", self, sizeof self - 1) > 0, "readlink self");
    area = malloc(AREA);
    churn_area = malloc(AREA);
    CHECK(area && churn_area, "malloc");
    memset(area, 0, AREA);
    memset(churn_area, 0, AREA);
    char dir[] = "/tmp/rmem-syscalls-XXXXXX";
    CHECK(mkdtemp(dir), "mkdtemp");
    char file[4200];
    snprintf(file, sizeof file, "%s/data", dir);
    FILE *f = fopen(file, "w");
    CHECK(f, "fopen");
    for (int i = 0; i < 5000; i++) fprintf(f, "line %d\n", i);
    fclose(f);

    /* getrandom (Python's os.urandom) */
    uint8_t *rnd = slot();
    churn();
    assert_evicted(rnd, 4096);
    CHECK(getrandom(rnd, 4096, 0) == 4096, "getrandom");
    int nonzero = 0;
    for (int i = 0; i < 4096; i++) nonzero += rnd[i] != 0;
    CHECK(nonzero > 3000, "getrandom gave %d non-zero bytes of 4096", nonzero);

    /* stat, open and readlink of a path that lies in remote memory */
    char *path = remote_str(file);
    struct stat *st = slot();
    churn();
    assert_evicted(path, 64);
    assert_evicted(st, sizeof *st);
    CHECK(stat(path, st) == 0 && st->st_size > 40000, "stat of a remote path");
    churn();
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0, "open of a remote path");
    char *link = remote_str("/proc/self/exe");
    char *target = slot();
    churn();
    assert_evicted(target, 4096);
    ssize_t tl = readlink(link, target, 4096);
    CHECK(tl == (ssize_t)strlen(self) && memcmp(target, self, tl) == 0, "readlink");
    char *cwd = slot();
    churn();
    CHECK(getcwd(cwd, 4096) == cwd && cwd[0] == '/', "getcwd");

    /* raw syscall(2) read, and preadv/pwritev through iovecs, into remote buffers */
    char expect[8192];
    CHECK(pread(fd, expect, sizeof expect, 0) == (ssize_t)sizeof expect, "pread local");
    char *buf = slot();
    churn();
    assert_evicted(buf, 8192);
    CHECK(syscall(SYS_read, fd, buf, 8192) == 8192 && memcmp(buf, expect, 8192) == 0,
          "raw read");
    char *b1 = slot(), *b2 = slot();
    churn();
    struct iovec iov[2] = {{b1, 3000}, {b2, 5192}};
    CHECK(preadv(fd, iov, 2, 0) == 8192, "preadv");
    CHECK(memcmp(b1, expect, 3000) == 0 && memcmp(b2, expect + 3000, 5192) == 0, "preadv data");
    memset(b1, 0, 3000);
    churn();
    assert_evicted(b1, 3000);
    CHECK(preadv2(fd, iov, 2, 0, 0) == 8192 && memcmp(b1, expect, 3000) == 0, "preadv2");
    char out_file[4300];
    snprintf(out_file, sizeof out_file, "%s/out", dir);
    int wfd = open(out_file, O_RDWR | O_CREAT, 0600);
    CHECK(wfd >= 0, "open out");
    churn();
    assert_evicted(b1, 3000);
    CHECK(pwritev(wfd, iov, 2, 0) == 8192, "pwritev");
    char back[8192];
    CHECK(pread(wfd, back, 8192, 0) == 8192 && memcmp(back, expect, 8192) == 0, "pwritev data");

    /* stdio reading through a buffer in remote memory (setvbuf) */
    FILE *s = fopen(file, "r");
    CHECK(s, "fopen");
    char *sbuf = slot();
    CHECK(setvbuf(s, sbuf, _IOFBF, 65536) == 0, "setvbuf");
    char line[64];
    for (int i = 0; i < 5000; i++) {
        if (i % 1000 == 0) churn();
        CHECK(fgets(line, sizeof line, s) != NULL, "fgets returned NULL at line %d", i);
        char want[64];
        snprintf(want, sizeof want, "line %d\n", i);
        CHECK(strcmp(line, want) == 0, "line %d reads %s", i, line);
    }
    fclose(s);

    /* poll, select and epoll_wait with their arrays in remote memory */
    int pfd[2];
    CHECK(pipe(pfd) == 0, "pipe");
    CHECK(write(pfd[1], "x", 1) == 1, "write");
    struct pollfd *pf = slot();
    pf[0].fd = pfd[0];
    pf[0].events = POLLIN;
    churn();
    assert_evicted(pf, sizeof *pf);
    CHECK(poll(pf, 1, 1000) == 1 && (pf[0].revents & POLLIN), "poll");
    fd_set *rs = slot();
    FD_ZERO(rs);
    FD_SET(pfd[0], rs);
    struct timeval *tv = slot();
    tv->tv_sec = 1;
    churn();
    CHECK(select(pfd[0] + 1, rs, NULL, NULL, tv) == 1 && FD_ISSET(pfd[0], rs), "select");
    int ep = epoll_create1(0);
    struct epoll_event *ev = slot();
    ev->events = EPOLLIN;
    ev->data.u64 = 77;
    churn();
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, pfd[0], ev) == 0, "epoll_ctl");
    struct epoll_event *evs = slot();
    churn();
    assert_evicted(evs, 16 * sizeof *evs);
    CHECK(epoll_wait(ep, evs, 16, 1000) == 1 && evs[0].data.u64 == 77, "epoll_wait");

    /* futex: a mutex and condition variable in remote memory, a timed wait */
    lock = slot();
    cond = slot();
    flag = slot();
    pthread_mutex_init(lock, NULL);
    pthread_cond_init(cond, NULL);
    *flag = 0;
    pthread_t t;
    pthread_create(&t, NULL, waker, NULL);
    churn();
    pthread_mutex_lock(lock);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    while (!*flag) {
        int r = pthread_cond_timedwait(cond, lock, &until);
        CHECK(r == 0, "pthread_cond_timedwait: %d", r);
    }
    pthread_mutex_unlock(lock);
    pthread_join(t, NULL);
    unsigned *word = slot();
    *word = 5;
    churn();
    assert_evicted(word, 4);
    struct timespec *shortly = remote_ts(0, 1000000);
    long fr = syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, 6, shortly, NULL, 0);
    CHECK(fr == -1 && errno == EAGAIN, "futex on a remote word: %ld", fr);

    /* nanosleep and wait4 writing into remote memory */
    struct timespec *nap = remote_ts(0, 1000);
    churn();
    CHECK(nanosleep(nap, NULL) == 0, "nanosleep");
    pid_t child = fork();
    if (child == 0) _exit(42);
    int *status = slot();
    churn();
    assert_evicted(status, 4);
    CHECK(waitpid(child, status, 0) == child && WIFEXITED(*status) && WEXITSTATUS(*status) == 42,
          "waitpid");

    /* io_uring: refused, clearly, where the kernel cannot fault remote memory in */
    if (unprivileged) {
        struct {
            uint32_t v[30];
        } *params = slot();
        long ur = syscall(SYS_io_uring_setup, 8, params);
        CHECK(ur == -1 && errno == ENOSYS, "io_uring_setup gave %ld", ur);
    }

    /* Memory the program made inaccessible or read-only: the kernel answers EFAULT where it
       reads or writes it, and does not look at arguments an operation does not use. Before,
       rmem touched them itself for the kernel, and the program died of SIGSEGV (Node.js, now
       and then: glibc's FUTEX_WAKE leaves a stale pointer in the unused uaddr2). */
    {
        uint8_t *none = (uint8_t *)(((uintptr_t)slot() + 4095) & ~4095ul);
        uint8_t *ro = (uint8_t *)(((uintptr_t)slot() + 4095) & ~4095ul);
        strcpy((char *)none, file);
        ro[0] = 9;
        CHECK(mprotect(none, 8192, PROT_NONE) == 0, "mprotect PROT_NONE");
        CHECK(mprotect(ro, 8192, PROT_READ) == 0, "mprotect PROT_READ");
        unsigned local_word = 0;
        long w = syscall(SYS_futex, &local_word, FUTEX_WAKE_PRIVATE, 1, NULL, none, 0);
        CHECK(w == 0, "FUTEX_WAKE with an inaccessible uaddr2 gave %ld", w);
        int fd = open(file, O_RDONLY);
        CHECK(fd >= 0, "open");
        errno = 0;
        CHECK(syscall(SYS_read, fd, ro, 100) == -1 && errno == EFAULT, "raw read into read-only");
        errno = 0;
        CHECK(read(fd, none, 100) == -1 && errno == EFAULT, "read into inaccessible");
        int pw[2];
        CHECK(pipe(pw) == 0, "pipe");
        errno = 0;
        CHECK(syscall(SYS_write, pw[1], none, 100) == -1 && errno == EFAULT,
              "raw write from inaccessible");
        CHECK(syscall(SYS_write, pw[1], ro, 1) == 1, "raw write from read-only");
        struct stat sb;
        errno = 0;
        CHECK(syscall(SYS_newfstatat, AT_FDCWD, none, &sb, 0) == -1 && errno == EFAULT,
              "stat of an inaccessible path");
        errno = 0;
        CHECK(syscall(SYS_nanosleep, none, NULL) == -1 && errno == EFAULT,
              "nanosleep with an inaccessible timespec");
        errno = 0;
        CHECK(syscall(SYS_clock_gettime, CLOCK_MONOTONIC, ro) == -1 && errno == EFAULT,
              "clock_gettime into read-only");
        CHECK(ro[0] == 9, "read-only memory was changed");
        int sv[2];
        CHECK(socketpair(AF_UNIX, SOCK_DGRAM, 0, sv) == 0, "socketpair");
        CHECK(write(sv[0], "datagram", 8) == 8, "send a datagram");
        errno = 0;
        CHECK(syscall(SYS_recvfrom, sv[1], ro, 100, 0, NULL, NULL) == -1 && errno == EFAULT,
              "datagram into read-only");
        CHECK(write(sv[0], "datagram", 8) == 8, "send a datagram");
        struct iovec riov = {ro, 100};
        struct msghdr rmsg = {.msg_iov = &riov, .msg_iovlen = 1};
        errno = 0;
        CHECK(recvmsg(sv[1], &rmsg, 0) == -1 && errno == EFAULT, "recvmsg into read-only");
        CHECK(ro[0] == 9, "read-only memory was changed by a receive");
        close(sv[0]);
        close(sv[1]);
        close(pw[0]);
        close(pw[1]);
        close(fd);
        CHECK(mprotect(none, 8192, PROT_READ | PROT_WRITE) == 0, "mprotect back");
        CHECK(strcmp((char *)none, file) == 0, "inaccessible memory lost its contents");
    }

    unlink(file);
    unlink(out_file);
    rmdir(dir);

    /* posix_spawn (glibc's system() and popen() use it) and execv, with their argument
       strings and arrays in remote memory */
    char **args = remote_args();
    char *prog = remote_str(self);
    churn();
    assert_evicted(args, 64);
    pid_t spawned;
    int sr = posix_spawn(&spawned, prog, NULL, NULL, args, environ);
    CHECK(sr == 0, "posix_spawn: %d", sr);
    int spawn_status;
    CHECK(waitpid(spawned, &spawn_status, 0) == spawned, "waitpid spawned");
    CHECK(WIFEXITED(spawn_status) && WEXITSTATUS(spawn_status) == 0,
          "the spawned copy ended with status %#x", spawn_status);
    args = remote_args();
    prog = remote_str(self);
    churn();
    assert_evicted(args, 64);
    assert_evicted(args[2], 8);
    printf("syscalls: ok\n");
    fflush(stdout);
    execv(prog, args);
    CHECK(0, "execv");
}
