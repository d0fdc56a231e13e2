/* The arrays the three files share: defined in main.c, declared here for all. */
#define ROWS 512
#define COLS 1024
struct cell {
    int row;
    float weight;
};
extern dlm double grid[ROWS][COLS];
extern dlm struct cell cells[ROWS];
extern dlm long totals[];
void fill(void);
double sum_rows(void);
