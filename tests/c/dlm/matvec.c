/* The DLM paper's Fig. 2 (matrix-vector multiply), as printed but for the OCR's damage, with
 * N small enough for a test and a check of the result. a[i][j] = i and x[j] = j, so
 * y[i] = i * N(N-1)/2. Build with `rmem cc`; `cc -Ddlm=` builds it without remote memory. */
#include <stdio.h>
#ifndef N
#define N 1024 /* a: 8 MiB, x: 8 KiB */
#endif
dlm double a[N][N], x[N]; //DLM static declare
main(int argc, char *argv[])
{ int i,j;
  double *y; // DLM dynamic alloc y
  y = (double *) dlm_alloc ( sizeof(double) *N );
  for(i = 0; i < N; i++) // Initialize a
     for(j = 0; j < N; j++)  a[i][j] = i;
  for(i = 0; i < N; i++)  x[i] = i;  // Initialize x
  for(i = 0; i < N; i++) {           // multiply
      y[i]=0;                        // initialize y
      for(j = 0; j < N; j++) y[i] += a[i][j] * x[j];
  }
  double want = (double)N * (N - 1) / 2, bad = 0;
  for(i = 0; i < N; i++) if (y[i] != i * want) bad++;
  printf("matvec N=%d y[N-1]=%.0f bad=%.0f sizeof a=%zu\n", N, y[N-1], bad, sizeof a);
  return bad != 0;
}
