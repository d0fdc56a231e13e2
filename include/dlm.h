/* The DLM API (Midorikawa et al., "DLM: A Distributed Large Memory System using Remote
 * Memory Swapping over Cluster Nodes", Cluster 2008), implemented by librmem.
 *
 *   dlm_init(&argc, &argv);      optional; NULLs accepted
 *   double *a = dlm_alloc(n * sizeof(double));
 *   ...
 *   dlm_free(a);
 *   dlm_exit();
 *
 * Run under `rmem run --api -- PROGRAM ARGS`, which starts the memory servers, or directly:
 * with no servers configured the first call starts local memory servers (or those of the
 * hosts file named by RMEM_HOSTFILE, else ./dlm_hosts) and they stop when the program exits.
 * `rmem cc` (dlmcc) compiles programs that declare arrays `dlm double a[N][N];`.
 */
#ifndef DLM_H
#define DLM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Start rmem. argc/argv are accepted for compatibility with DLM and left unchanged; either
 * may be NULL. Returns 0, or -1 with a message on stderr. Idempotent. */
int dlm_init(int *argc, char ***argv);

/* Zeroed remote memory, as rmem_alloc. */
void *dlm_alloc(size_t size);

/* Free memory from dlm_alloc. */
void dlm_free(void *ptr);

/* Finalize: statistics, then the region is released. */
void dlm_exit(void);

#ifdef __cplusplus
}
#endif

#endif /* DLM_H */
