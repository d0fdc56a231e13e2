/* A warning after dlm declarations must point at this file's line 8. */
#include <stdio.h>
dlm double big[1 << 16], other[3] = {1,
                                     2, 3};

int main(void)
{
    int unused;
    printf("%g\n", big[1] + other[2]);
    return 0;
}
