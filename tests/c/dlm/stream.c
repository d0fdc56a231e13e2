/* STREAM-like kernels (copy, scale, add, triad) over arrays that are dlm statics: two at file
 * scope (`static dlm`), one static in a function. Self-checking; prints the checksums, which
 * a plain build (`cc -Ddlm=`) prints the same. */
#include <stdio.h>
#ifndef STREAM_N
#define STREAM_N (1 << 20) /* 8 MiB per array */
#endif
#define NTIMES 3

static dlm double a[STREAM_N], b[STREAM_N];

static double *third(void)
{
    static dlm double c[STREAM_N];
    return c;
}

int main(void)
{
    double *c = third(), q = 3.0;
    long j;
    for (j = 0; j < STREAM_N; j++) {
        a[j] = 1.0;
        b[j] = 2.0;
        c[j] = 0.0;
    }
    for (int k = 0; k < NTIMES; k++) {
        for (j = 0; j < STREAM_N; j++) c[j] = a[j];
        for (j = 0; j < STREAM_N; j++) b[j] = q * c[j];
        for (j = 0; j < STREAM_N; j++) c[j] = a[j] + b[j];
        for (j = 0; j < STREAM_N; j++) a[j] = b[j] + q * c[j];
    }
    /* The same recurrence on scalars gives the expected values. */
    double ea = 1.0, eb = 2.0, ec = 0.0;
    for (int k = 0; k < NTIMES; k++) {
        ec = ea;
        eb = q * ec;
        ec = ea + eb;
        ea = eb + q * ec;
    }
    double sa = 0, sb = 0, sc = 0;
    for (j = 0; j < STREAM_N; j++) {
        sa += a[j];
        sb += b[j];
        sc += c[j];
    }
    int ok = sa == ea * STREAM_N && sb == eb * STREAM_N && sc == ec * STREAM_N;
    printf("stream n=%d a=%.0f b=%.0f c=%.0f bytes=%zu %s\n", STREAM_N, sa, sb, sc,
           sizeof a + sizeof b, ok ? "ok" : "WRONG");
    return !ok;
}
