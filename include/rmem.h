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
#include <sys/types.h>

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

/* ---- Direct regions: byte ranges on the memory servers, no paging ----
 *
 * A region is `size` bytes on the memory servers, zeroed at first, read and written with
 * copies between your buffers and the servers: nothing is mapped, nothing is cached, any
 * offset and length work (partial pages included) and only the bytes asked cross the network
 * (a 100-byte rmem_read moves about 100 bytes: see rmem_region_get_stats). Regions need no
 * rmem_init and work beside rmem_alloc; configured like it (rmem run's environment, or
 * servers this process starts itself). Every call is safe from several threads at once and
 * keeps many requests in flight. Calls that fail return -1 (or NULL) with errno set and a
 * message rmem_last_error() returns:
 *   EINVAL  a NULL region, buffer or name, a range outside the region, a bad name or size
 *   ENOSPC  a memory server is full (the page of a range written for the first time), or
 *           every server (or the pool's grant) is
 *   EIO     a memory server was lost (with no redundancy left to cover it), or the region's
 *           creator freed it or exited (the region is then unusable; every later call fails
 *           the same way)
 *   ENOENT  rmem_region_open: no such name, or its creator is gone
 *   EEXIST  rmem_region_create_named: the name is held by a live process
 * Concurrent writes of overlapping bytes land in no particular order; a read concurrent
 * with a write of the same bytes may see either, page piece by page piece. */

typedef struct rmem_region rmem_region_t;

/* One range of a list call: `len` bytes at `offset` of the region, to or from `buf`. */
struct rmem_range {
    uint64_t offset;
    void *buf;
    size_t len;
};

struct rmem_region_stats {
    uint64_t size;            /* the region's bytes */
    uint64_t page_size;       /* ranges are split at multiples of it, one request a piece */
    uint64_t reads;           /* successful read calls (rmem_read, rmem_readv) */
    uint64_t writes;
    uint64_t bytes_read;      /* bytes those calls asked for */
    uint64_t bytes_written;
    uint64_t bytes_fetched;   /* page data that came from the servers */
    uint64_t bytes_sent;      /* page data that went to the servers */
    uint64_t requests;        /* requests sent: one per piece of a range within a page; under
                                 a sealed or coded layout or in a pool, one per page (or 4 KiB
                                 piece) read and one per page stored, whatever its copies */
};

/* A new region of `size` bytes (> 0), zeroed. NULL and errno on failure. */
rmem_region_t *rmem_region_create(size_t size);

/* The same, registered under `name` (1 to 64 of [A-Za-z0-9._-], not starting with '.') so
 * that other processes of this user can rmem_region_open it while this one holds it. The
 * registration (a 0600 file in $XDG_RUNTIME_DIR/rmem-regions, else /tmp/rmem-regions-UID)
 * names the servers and holds their token; it is removed by rmem_region_free. */
rmem_region_t *rmem_region_create_named(const char *name, size_t size);

/* The region another process of this user created under `name` and has not freed: the same
 * bytes (no copy). Freeing it here leaves the region to its creator. */
rmem_region_t *rmem_region_open(const char *name);

/* Free the region: its creator's free returns its memory to the servers (openers' later calls
 * fail with EIO); an opener's only closes its connections. No call on it may be running or
 * follow. NULL is ignored. */
void rmem_region_free(rmem_region_t *region);

/* The region's size in bytes (0 for NULL). */
uint64_t rmem_region_size(const rmem_region_t *region);

/* Read `len` bytes at `offset` into `buf` / write `len` bytes of `buf` at `offset`. The
 * whole range must lie inside the region (else EINVAL, nothing moved). Returns `len`, or -1. */
ssize_t rmem_read(const rmem_region_t *region, uint64_t offset, void *buf, size_t len);
ssize_t rmem_write(const rmem_region_t *region, uint64_t offset, const void *buf, size_t len);

/* Every range of `ranges` at once, all in flight together. Nothing moves unless every range
 * lies inside the region. Returns the sum of the lengths, or -1 (after a failure of the
 * servers some ranges may have been written and others not). */
ssize_t rmem_readv(const rmem_region_t *region, const struct rmem_range *ranges, size_t count);
ssize_t rmem_writev(const rmem_region_t *region, const struct rmem_range *ranges, size_t count);

/* Fill `out` with the region's statistics. Returns 0, or -1 (EINVAL). */
int rmem_region_get_stats(const rmem_region_t *region, struct rmem_region_stats *out);

/* The message of the last region call that failed on this thread ("" if none); valid until
 * the next failure on this thread. */
const char *rmem_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* RMEM_H */
