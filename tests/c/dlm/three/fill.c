#include "shared.h"

void fill(void)
{
    for (int i = 0; i < ROWS; i++) {
        cells[i].row = i;
        cells[i].weight = (float)(i % 3 + 1);
        totals[i] += i;
        for (int j = 0; j < COLS; j++)
            grid[i][j] = i;
    }
}
