/* rmem: remote memory paged in on demand from memory servers.
 *
 * Link with -lrmem (target/release/librmem.so) and run under `rmem run --api -- PROGRAM`,
 * which starts the memory servers and puts their addresses and the configuration in the
 * environment (see docs/configuration.md); run directly, the first call starts memory servers
 * of its own (RMEM_HOSTFILE, ./dlm_hosts, or two on loopback). Memory from rmem_alloc lives on the servers and is
 * brought in when touched; at most RMEM_LOCAL bytes of it are resident at once.
 */
#ifndef RMEM_H
#define RMEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Statistics since rmem_init. Field names match the keys of `--stats-json`. */
struct rmem_stats {
    uint64_t swap_ins;           /* pages fetched from servers */
    uint64_t swap_outs;          /* pages written back to servers */
    uint64_t evictions;          /* pages dropped from local memory (clean or dirty) */
    uint64_t zero_fills;         /* never-written pages filled locally, no network */
    uint64_t faults;             /* missing-page faults resolved */
    uint64_t wp_faults;          /* first writes to clean pages (dirty tracking) */
    double fault_us_p50;         /* fault resolution time, median, microseconds */
    double fault_us_p99;
    uint64_t bytes_fetched;
    uint64_t bytes_written_back;
    uint64_t local_bytes_max;    /* most local bytes held at once */
    uint64_t page_size;          /* the DLM page size in bytes */
    char policy[16];             /* replacement policy name, NUL-terminated */
    double select_us_total;      /* time spent choosing victims */
    double select_us_max;
};

/* Connect to the memory servers named by the environment and start the pager.
 * Idempotent: later calls return 0 at once. Returns 0, or -1 with a message on stderr.
 * Called implicitly by the first rmem_alloc. */
int rmem_init(void);

/* Allocate `size` bytes of zeroed remote memory. Sizes of a quarter DLM page or more are
 * aligned to the DLM page size. Returns NULL (errno ENOMEM) when the servers' capacity is
 * exhausted or rmem could not start. */
void *rmem_alloc(size_t size);

/* Free memory from rmem_alloc; its pages go back to the servers. NULL is ignored. */
void rmem_free(void *ptr);

/* Usable size of an allocation, 0 if `ptr` is not one. */
size_t rmem_usable_size(void *ptr);

/* Write the statistics JSON if RMEM_STATS_JSON is set, stop the pager and release the
 * region. Touching rmem memory afterwards is an error (SIGSEGV). */
void rmem_exit(void);

/* Fill `out` with the statistics. Returns 0, or -1 if rmem is not running. */
int rmem_get_stats(struct rmem_stats *out);

/* The DLM page size in bytes, 0 if rmem is not running. */
size_t rmem_page_size(void);

#ifdef __cplusplus
}
#endif

#endif /* RMEM_H */
