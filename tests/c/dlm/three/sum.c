#include "shared.h"

/* A row passed as a plain pointer: the array decays as it always did. */
static double row_sum(const double *row, float w)
{
    double s = 0;
    for (int j = 0; j < COLS; j++)
        s += row[j] * w;
    return s;
}

double sum_rows(void)
{
    double s = 0;
    for (int i = 0; i < ROWS; i++)
        s += row_sum(grid[i], cells[i].weight);
    return s;
}
