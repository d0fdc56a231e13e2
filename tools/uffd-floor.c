/*
 * uffd-floor: the least a blocking userfaultfd handler can add to a network round trip on
 * this machine. A reference for `rmem bench fault`, not part of rmem.
 *
 * One process, one loopback TCP connection to a forked echo server that answers a 16-byte
 * request with 4 KiB (sleeping in epoll between requests, like rmem's server). It measures,
 * in alternating blocks:
 *   - the raw round trip: send, spin on a non-blocking recv until 4 KiB are in;
 *   - a remote fault: a program thread reads a missing page of a registered region; a handler
 *     thread spinning on the userfaultfd does the same round trip and installs the answer
 *     with UFFDIO_COPY. Like rmem's pager, the handler spins for 200 us after its last fault,
 *     then sleeps in poll(2). No page table, no policy, no eviction: nothing rmem's pager does
 *     beyond what any blocking handler must.
 *
 * Then, for each thread count given after the samples, faults per second with that many
 * program threads touching pages of their own at once, served by the same single blocking
 * handler (what `rmem bench fault --threads` is compared with).
 *
 * Build and run:  cc -O2 -pthread -o uffd-floor tools/uffd-floor.c && ./uffd-floor [samples [threads...]]
 * Prints one line:  rtt_us_p50 F fault_us_p50 F ratio_p50 F
 * and one per thread count:  threads T faults_per_s F
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096
#define REQ 16
#define ROUNDS 10

static int sock, uffd;
static char answer[PAGE];

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void round_trip(void)
{
	char req[REQ] = { 0 };
	if (send(sock, req, REQ, 0) != REQ)
		die("send");
	size_t got = 0;
	while (got < PAGE) {
		ssize_t r = recv(sock, answer + got, PAGE - got, MSG_DONTWAIT);
		if (r > 0)
			got += r;
		else if (r == 0)
			die("server closed");
		else if (errno != EAGAIN)
			die("recv");
	}
}

static void serve(int listener)
{
	int c = accept(listener, NULL, NULL), one = 1;
	if (c < 0)
		die("accept");
	setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	static char page[PAGE];
	int ep = epoll_create1(0);
	struct epoll_event ev = { .events = EPOLLIN };
	epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
	for (;;) {
		char req[REQ];
		size_t got = 0;
		epoll_wait(ep, &ev, 1, -1);
		while (got < REQ) {
			ssize_t r = read(c, req + got, REQ - got);
			if (r <= 0)
				_exit(0);
			got += r;
		}
		if (write(c, page, PAGE) != PAGE)
			_exit(1);
	}
}

static void *handler(void *arg)
{
	(void)arg;
	double last = now_us();
	for (;;) {
		struct uffd_msg m;
		ssize_t r = read(uffd, &m, sizeof m);
		if (r < 0 && errno == EAGAIN) {
			if (now_us() - last > 200) {
				struct pollfd p = { .fd = uffd, .events = POLLIN };
				poll(&p, 1, -1);
			}
			continue;
		}
		if (r != sizeof m)
			die("read uffd");
		round_trip();
		struct uffdio_copy c = {
			.dst = m.arg.pagefault.address & ~(unsigned long long)(PAGE - 1),
			.src = (unsigned long)answer,
			.len = PAGE,
		};
		if (ioctl(uffd, UFFDIO_COPY, &c))
			die("UFFDIO_COPY");
		last = now_us();
	}
	return NULL;
}

/* `len` bytes of fresh memory whose missing pages the handler serves. */
static char *registered(size_t len)
{
	char *region = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (region == MAP_FAILED)
		die("mmap");
	struct uffdio_register reg = {
		.range = { .start = (unsigned long)region, .len = len },
		.mode = UFFDIO_REGISTER_MODE_MISSING,
	};
	if (ioctl(uffd, UFFDIO_REGISTER, &reg))
		die("UFFDIO_REGISTER");
	return region;
}

/* Faults each program thread takes per thread count. */
#define PER_THREAD 4000

struct toucher {
	char *base;
	int pages;
};

static void *touch(void *arg)
{
	struct toucher *t = arg;
	for (int i = 0; i < t->pages; i++)
		(void)*(volatile char *)(t->base + (size_t)i * PAGE);
	return NULL;
}

/* Faults per second with `threads` program threads, each on fresh pages of its own. */
static double fault_rate(int threads)
{
	size_t len = (size_t)threads * PER_THREAD * PAGE;
	char *region = registered(len);
	pthread_t t[256];
	struct toucher w[256];
	double t0 = now_us();
	for (int i = 0; i < threads; i++) {
		w[i] = (struct toucher){ region + (size_t)i * PER_THREAD * PAGE, PER_THREAD };
		pthread_create(&t[i], NULL, touch, &w[i]);
	}
	for (int i = 0; i < threads; i++)
		pthread_join(t[i], NULL);
	double secs = (now_us() - t0) / 1e6;
	munmap(region, len);
	return threads * (double)PER_THREAD / secs;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 20000;
	if (n < ROUNDS)
		n = ROUNDS;
	int block = n / ROUNDS;
	n = block * ROUNDS;

	int listener = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof sa;
	if (bind(listener, (void *)&sa, sizeof sa) || listen(listener, 1) ||
	    getsockname(listener, (void *)&sa, &sl))
		die("listen");
	pid_t server = fork();
	if (server == 0)
		serve(listener);
	sock = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(sock, (void *)&sa, sizeof sa))
		die("connect");
	setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

	uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
	if (uffd < 0)
		die("userfaultfd");
	struct uffdio_api api = { .api = UFFD_API };
	if (ioctl(uffd, UFFDIO_API, &api))
		die("UFFDIO_API");
	size_t len = (size_t)n * PAGE;
	char *region = registered(len);
	pthread_t t;
	pthread_create(&t, NULL, handler, NULL);

	double *rtt = malloc(n * sizeof *rtt), *fault = malloc(n * sizeof *fault);
	for (int i = 0; i < 1000; i++)
		round_trip(); /* warm up (the handler is idle: no fault is pending) */
	for (int r = 0, k = 0; r < ROUNDS; r++) {
		for (int i = 0; i < block; i++) {
			double t0 = now_us();
			round_trip();
			rtt[r * block + i] = now_us() - t0;
		}
		for (int i = 0; i < block; i++, k++) {
			double t0 = now_us();
			(void)*(volatile char *)(region + (size_t)k * PAGE);
			fault[k] = now_us() - t0;
		}
	}
	qsort(rtt, n, sizeof *rtt, cmp);
	qsort(fault, n, sizeof *fault, cmp);
	printf("rtt_us_p50 %.1f fault_us_p50 %.1f ratio_p50 %.2f\n", rtt[n / 2], fault[n / 2],
	       fault[n / 2] / rtt[n / 2]);
	for (int a = 2; a < argc; a++) {
		int threads = atoi(argv[a]);
		if (threads < 1 || threads > 256) {
			fprintf(stderr, "uffd-floor: thread counts 1 to 256\n");
			return 2;
		}
		printf("threads %d faults_per_s %.0f\n", threads, fault_rate(threads));
	}
	kill(server, SIGKILL);
	waitpid(server, NULL, 0);
	return 0;
}
