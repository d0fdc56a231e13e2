/* Every case of the translation (issue 14, point 2), printing what a program can observe.
 * The test builds it with `rmem cc` and with `cc -Ddlm=` (plain arrays) and wants the same
 * output from both. */
#include <stdio.h>
#include <string.h>

#define ROWS (2 * 3 + 1)
enum { E = 5 };
typedef struct {
    int k;
    double v;
} item;
typedef double vec3[3];

/* Several declarators in one declaration, dlm and plain mixed. */
dlm int m1[3], s1 = 5, m2[ROWS][sizeof(int) * 2], *p1;
/* Structs, typedefs, an array typedef as the element. */
dlm item items[E * 2];
dlm struct pt { int x, y; } pts[4];
dlm vec3 pos[E + 1];
/* Sizes from macros, enums and constant expressions. */
dlm char e[E + 1], big[1 << 16];
/* Initial values. */
dlm int t[4] = {1, 2, 3, 4};
dlm int u[] = {5, 6, 7};
dlm char msg[] = "hello";
dlm double mat[2][3] = {{1, 2, 3}, {4, 5, 6}};
dlm int sparse[10] = {[7] = 70, [2] = 20};
dlm item it0[2] = {{1, 1.5}, {.v = 2.5, .k = 2}};
static dlm long quiet[8];

static int sum(const int *p, int n)
{
    int s = 0;
    for (int i = 0; i < n; i++) s += p[i];
    return s;
}

static double rowsum(double r[][3], int n)
{
    double s = 0;
    for (int i = 0; i < n; i++) s += r[i][0] + r[i][1] + r[i][2];
    return s;
}

static int counter(void)
{
    static dlm int hits[16], calls;
    static dlm int seq[5] = {9, 8, 7, 6, 5};
    hits[calls % 16]++;
    calls++;
    return calls + seq[calls % 5] + (int)(sizeof hits + sizeof seq);
}

static size_t shadow(int m1)
{
    /* A parameter named like a dlm array is that parameter. */
    return sizeof m1;
}

int main(void)
{
    m1[2] = 3;
    m2[ROWS - 1][7] = 42;
    p1 = &m1[1];
    *p1 = 11;
    items[9].k = 9;
    items[9].v = 0.5;
    pts[3].y = -1;
    pos[E][2] = 2.25;
    strcpy(e, "abcd");
    big[(1 << 16) - 1] = 'z';
    quiet[7] = 77;

    printf("values: %d %d %d %d %d %g %d %g %s %c %ld\n", m1[1], m1[2], s1, m2[ROWS - 1][7],
           items[9].k, items[9].v, pts[3].y, pos[E][2], e, big[(1 << 16) - 1], quiet[7]);
    printf("init: %d %d %d %d | %d %d %d | %s | %g %g | %d %d %d | %d %g %d %g\n", t[0], t[1],
           t[2], t[3], u[0], u[1], u[2], msg, mat[0][2], mat[1][0], sparse[2], sparse[7],
           sparse[0], it0[0].k, it0[0].v, it0[1].k, it0[1].v);
    printf("sizeof: %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu\n", sizeof m1, sizeof(m2),
           sizeof m2[0], sizeof items, sizeof pts, sizeof pos, sizeof pos[0], sizeof e,
           sizeof t, sizeof u, sizeof msg, sizeof(mat) / sizeof(mat[0]));
    printf("counts: %zu %zu %zu\n", sizeof u / sizeof u[0], sizeof big / sizeof *big,
           sizeof((mat)));
    /* &a is a pointer to the whole array: one past it is sizeof a bytes on. */
    int (*pt4)[4] = &t;
    printf("address: %d %td %td %d\n", (*pt4)[2], (char *)(&t + 1) - (char *)t,
           (char *)(&m2 + 1) - (char *)&m2[0][0], &m2 == (void *)m2);
    /* typeof(a) is the array type, _Alignof(a) its element's alignment. */
    __typeof__(m2) *pm2 = &m2;
    printf("types: %zu %zu %d\n", sizeof(__typeof__(items)), _Alignof(items), (*pm2)[ROWS - 1][7]);
    /* Passed to functions expecting a pointer or an array of rows. */
    printf("calls: %d %d %g\n", sum(t, 4), sum(&u[0], 3), rowsum(mat, 2));
    int c1 = counter(), c2 = counter();
    printf("statics: %d %d %zu\n", c1, c2, shadow(1));
    return 0;
}
