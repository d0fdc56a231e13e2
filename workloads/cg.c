/* cg: CG-like sparse matrix-vector products (NAS Parallel Benchmarks CG; DLM's NPB runs):
 * a CSR matrix with NNZ nonzeros per row (the diagonal and NNZ-1 uniform columns) multiplies
 * a vector over and over, normalised each time (power iteration). The matrix's values and
 * columns are streamed; the vector is gathered at random. SIZE MiB in all. Second argument:
 * products (default 5).
 * Self-check: after the first product, sampled rows are recomputed from the generated matrix
 * and vector; at the end every column index and value is compared with its generated value
 * and the vector's norm must be 1. */
#include <math.h>
#include "wl.h"

enum { NNZ = 16 };

static uint32_t col_at(size_t rows, size_t r, size_t k) {
    return k == 0 ? (uint32_t)r : (uint32_t)(wl_hash(1ull << 62 ^ (r * NNZ + k)) % rows);
}
static double val_at(size_t r, size_t k) {
    return wl_hash_double(2ull << 62 ^ (r * NNZ + k));
}
static double x0_at(size_t i) {
    return wl_hash_double(3ull << 62 ^ i);
}

static void spmv(size_t rows, const size_t *rowptr, const uint32_t *col, const double *val,
                 const double *x, double *y) {
    for (size_t r = 0; r < rows; r++) {
        double s = 0;
        for (size_t e = rowptr[r]; e < rowptr[r + 1]; e++)
            s += val[e] * x[col[e]];
        y[r] = s;
    }
}

/* x = y / |y|; returns |y|. */
static double normalise(size_t rows, const double *y, double *x) {
    double ss = 0;
    for (size_t r = 0; r < rows; r++)
        ss += y[r] * y[r];
    double norm = sqrt(ss);
    for (size_t r = 0; r < rows; r++)
        x[r] = y[r] / norm;
    return norm;
}

int main(int argc, char **argv) {
    uint64_t iters = 5;
    size_t size = wl_args("cg", argc, argv, &iters);
    size_t rows = size / (sizeof(size_t) + NNZ * (sizeof(uint32_t) + sizeof(double)) +
                          2 * sizeof(double));
    if (rows < 2 || iters == 0)
        wl_fail("size too small (or no products)");
    size_t *rowptr = wl_alloc((rows + 1) * sizeof(size_t));
    uint32_t *col = wl_alloc(rows * NNZ * sizeof(uint32_t));
    double *val = wl_alloc(rows * NNZ * sizeof(double));
    double *x = wl_alloc(rows * sizeof(double));
    double *y = wl_alloc(rows * sizeof(double));

    double t0 = wl_now();
    for (size_t r = 0; r <= rows; r++)
        rowptr[r] = r * NNZ;
    for (size_t r = 0; r < rows; r++) {
        x[r] = x0_at(r);
        for (size_t k = 0; k < NNZ; k++) {
            col[r * NNZ + k] = col_at(rows, r, k);
            val[r * NNZ + k] = val_at(r, k);
        }
    }
    double norm = 0;
    uint64_t s = 777;
    for (uint64_t it = 0; it < iters; it++) {
        spmv(rows, rowptr, col, val, x, y);
        for (int probe = 0; it == 0 && probe < 256; probe++) {
            size_t r = wl_rand(&s) % rows;
            double want = 0;
            for (size_t k = 0; k < NNZ; k++)
                want += val_at(r, k) * x0_at(col_at(rows, r, k));
            if (y[r] != want)
                wl_fail("first product, row %zu: %g, expected %g", r, y[r], want);
        }
        norm = normalise(rows, y, x);
    }
    double secs = wl_now() - t0;

    double ss = 0;
    for (size_t r = 0; r < rows; r++) {
        ss += x[r] * x[r];
        if (rowptr[r] != r * NNZ)
            wl_fail("row pointer %zu is %zu", r, rowptr[r]);
        for (size_t k = 0; k < NNZ; k++)
            if (col[r * NNZ + k] != col_at(rows, r, k) || val[r * NNZ + k] != val_at(r, k))
                wl_fail("matrix entry (%zu, %zu) changed", r, k);
    }
    if (!isfinite(norm) || fabs(ss - 1.0) > 1e-9)
        wl_fail("norm %g, |x|^2 = %.12f, expected 1", norm, ss);
    wl_ok(secs, wl_fold(wl_bits(norm), rows));
    wl_free(rowptr);
    wl_free(col);
    wl_free(val);
    wl_free(x);
    wl_free(y);
    return 0;
}
