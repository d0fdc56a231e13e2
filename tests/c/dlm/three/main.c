/* Three files sharing dlm arrays: main.c defines them, fill.c writes them, sum.c reads them
 * through `extern dlm` declarations (shared.h). */
#include <stdio.h>
#include "shared.h"

dlm double grid[ROWS][COLS];
dlm struct cell cells[ROWS];
dlm long totals[ROWS] = {[0] = 7};

int main(void)
{
    fill();
    double s = sum_rows();
    double want = 0;
    for (int i = 0; i < ROWS; i++)
        want += (double)i * COLS * (i % 3 + 1);
    long t = 0;
    for (int i = 0; i < ROWS; i++)
        t += totals[i];
    printf("three s=%.0f want=%.0f totals=%ld sizeof grid=%zu cells[5].row=%d\n", s, want, t,
           sizeof grid, cells[5].row);
    return s != want || t != 7 + (long)ROWS * (ROWS - 1) / 2;
}
