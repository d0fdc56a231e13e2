/* Declares a dlm array without dlm: linking it with main.c must fail (the array is a
 * pointer named grid.dlm, so there is no `grid` to read as an array by mistake). */
extern double grid[512][1024];

double peek(void)
{
    return grid[1][1];
}
